"""Config paths are resolved once, against the user's working directory, and stay absolute in workers."""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from pipeline_lib.config import config_from_dict, load_config
from pipeline_lib.config.paths import resolve_input, resolve_output
from pipeline_lib.runtime.worker import run_worker
from pipeline_lib.storage import RunPaths

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "pipelines" / "tiny-cpu.yaml"


def _path_fields(cfg) -> dict:
    return {"run.output_root": cfg.run.output_root, "data.dedup.index_uri": cfg.data.dedup.index_uri,
            **{f"data.inputs[{i}]": v for i, v in enumerate(cfg.data.inputs)},
            **{f"sft.inputs[{i}]": v for i, v in enumerate(cfg.sft.inputs)},
            **{f"evaluate.prompt_files[{i}]": v for i, v in enumerate(cfg.evaluate.prompt_files)},
            **{f"evaluate.compare_checkpoints.{k}": v for k, v in cfg.evaluate.compare_checkpoints.items()},
            "tokenizer.path": cfg.tokenizer.path, "model.base_checkpoint": cfg.model.base_checkpoint,
            "model.hf_checkpoint": cfg.model.hf_checkpoint}


def test_tiny_config_from_another_cwd_has_only_absolute_paths(tmp_path, monkeypatch):
    user = tmp_path / "user"
    (user / "corpus").mkdir(parents=True)
    (user / "corpus" / "a.jsonl").write_text('{"text": "x"}\n')
    (user / "sft.jsonl").write_text('{"prompt": "p", "response": "r"}\n')
    monkeypatch.chdir(user)
    cfg = load_config(TINY, ["data.inputs=[corpus/*.jsonl, configs/data/tiny_corpus.jsonl, s3://bucket/raw/]",
                             "sft.inputs=[sft.jsonl]", "tokenizer.path=tok/tokenizer.model",
                             "model.base_checkpoint=ckpt/base.ckpt", "data.dedup.index_uri=index",
                             "evaluate.compare_checkpoints={last: ../night/last.ckpt}"])
    fields = _path_fields(cfg)
    local = {k: v for k, v in fields.items() if v is not None and not v.startswith("s3://")}
    assert all(os.path.isabs(v) for v in local.values()), local
    assert cfg.run.output_root == str(user / "runs")  # outputs land where the user ran the command
    assert cfg.data.inputs == [str(user / "corpus" / "*.jsonl"),  # a glob stays a glob
                               str(ROOT / "configs" / "data" / "tiny_corpus.jsonl"),  # bundled: from the repo
                               "s3://bucket/raw/"]
    assert cfg.sft.inputs == [str(user / "sft.jsonl")]
    assert cfg.evaluate.prompt_files[0] == str(ROOT / "configs" / "eval" / "domain_qa.jsonl")
    assert cfg.tokenizer.path == str(user / "tok" / "tokenizer.model")  # missing: still from the cwd
    assert cfg.model.base_checkpoint == str(user / "ckpt" / "base.ckpt")
    assert cfg.data.dedup.index_uri == str(user / "index")
    assert cfg.evaluate.compare_checkpoints == {"last": str(tmp_path / "night" / "last.ckpt")}
    # the dict flows pass around rebuilds to the same config anywhere (resolution is idempotent)
    dumped = cfg.model_dump(mode="json")
    monkeypatch.chdir(tmp_path)
    assert config_from_dict(dumped).model_dump(mode="json") == dumped


def test_defaults_are_absolute_and_uris_untouched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config_from_dict({})
    assert cfg.run.output_root == str(tmp_path / "runs")
    assert cfg.data.inputs == [str(ROOT / "configs" / "data" / "tiny_corpus.jsonl")]
    assert cfg.sft.inputs == [str(ROOT / "configs" / "data" / "tiny_sft.jsonl")]
    cfg.run.output_root = "elsewhere"  # assignment is validated too
    assert cfg.run.output_root == str(tmp_path / "elsewhere")
    assert resolve_output("s3://b/p") == "s3://b/p" and resolve_input("s3://b/x.jsonl") == "s3://b/x.jsonl"
    assert resolve_input("file://data/x.jsonl", cwd="/w") == "file:///w/data/x.jsonl"
    assert resolve_output("~/runs") == str(Path.home() / "runs")
    # a local file wins over the bundled one of the same relative name
    (tmp_path / "configs" / "data").mkdir(parents=True)
    (tmp_path / "configs" / "data" / "tiny_corpus.jsonl").write_text("{}\n")
    assert config_from_dict({}).data.inputs == [str(tmp_path / "configs" / "data" / "tiny_corpus.jsonl")]


ECHO = textwrap.dedent('''
    import os, sys
    from pipeline_lib.config.load import config_from_dict
    from pipeline_lib.runtime.worker import worker_main

    def run(req):
        cfg = config_from_dict(req["config"])
        return {"cwd": os.getcwd(), "output_root": cfg.run.output_root, "sft": cfg.sft.inputs,
                "prompts": cfg.evaluate.prompt_files, "argv": sys.argv[1:],
                "env": [os.environ["LOG_MF_PATH"], os.environ["MS_OM_PATH"]]}

    if __name__ == "__main__":
        raise SystemExit(worker_main(run))
''')


def test_a_worker_in_its_scratch_cwd_sees_the_users_absolute_paths(tmp_path, monkeypatch):
    """The evaluate/export stages send cfg.model_dump() to run_worker, which starts the worker in a
    scratch cwd: a relative output_root there named runs/<id>/... inside the scratch folder."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "echo_worker.py").write_text(ECHO)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pkg"))
    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.chdir(user)
    cfg = load_config(TINY)  # output_root: runs (relative in the yaml)
    request = {"config": cfg.model_dump(mode="json")}
    res = run_worker("echo_worker", request, "work", timeout_s=120)  # even a relative workdir
    assert res["cwd"] != str(user)
    assert all(os.path.isabs(a) for a in res["argv"] if not a.startswith("--")) and len(res["argv"]) == 4
    assert all(os.path.isabs(p) for p in res["env"])
    assert res["output_root"] == str(user / "runs")
    assert res["sft"] == cfg.sft.inputs and all(os.path.isabs(p) for p in res["sft"] + res["prompts"])
    sent = json.loads((user / "work" / "request.json").read_text())["config"]
    assert os.path.isabs(sent["run"]["output_root"])
    # the tokenizer the stages look up lives under the run folder: absolute too
    assert os.path.isabs(RunPaths(cfg.run.output_root, "r1").stage_uri("data"))
