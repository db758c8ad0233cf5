"""`nightly promote` re-verifies the held checkpoint against its run's manifest (issue 45 item 11)."""
from __future__ import annotations

from pathlib import Path

from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly import commit_night, load_state
from pipeline_lib.storage import RunPaths
from pipeline_lib.storage.manifest import Manifest, describe_file, write_manifest

ROOT = Path(__file__).resolve().parents[2]


def _held_night(tmp_path):
    cfg = config_from_dict({"run": {"output_root": str(tmp_path / "runs")}})
    stage = Path(RunPaths(cfg.run.output_root, "nightly-2026-12-02").stage_uri("pretrain"))
    (stage / "checkpoint").mkdir(parents=True)
    ckpt = stage / "checkpoint" / "tiny-1_8.ckpt"
    ckpt.write_bytes(b"weights of the night" * 100)
    write_manifest(str(stage), Manifest("pretrain", "nightly-2026-12-02", "x",
                                        outputs=[describe_file(ckpt, "checkpoint/tiny-1_8.ckpt")]))
    commit_night(cfg, {}, {"/raw/a.jsonl": 10}, "nightly-2026-12-02", str(ckpt), decision="held")
    return cfg, ckpt


def _promote(cfg, capsys) -> tuple[int, str]:
    from flows.cli import nightly_promote_main

    code = nightly_promote_main([str(ROOT / "configs/pipelines/tiny-cpu.yaml"),
                                 f"run.output_root={cfg.run.output_root}", "--run-id", "nightly-2026-12-02"])
    return code, capsys.readouterr().err


def test_a_held_checkpoint_changed_after_the_night_is_not_promoted(tmp_path, capsys):
    cfg, ckpt = _held_night(tmp_path)
    ckpt.write_bytes(b"something else" * 100)
    code, err = _promote(cfg, capsys)
    assert code == 2 and "the file changed after the night" in err and str(ckpt) in err and "Fix:" in err
    assert [h["run_id"] for h in load_state(cfg)["held"]] == ["nightly-2026-12-02"]  # still held, latest unmoved
    assert not load_state(cfg).get("latest")


def test_an_unchanged_held_checkpoint_is_promoted(tmp_path, capsys):
    cfg, _ = _held_night(tmp_path)
    code, err = _promote(cfg, capsys)
    assert code == 0, err
    assert load_state(cfg)["latest"]["run_id"] == "nightly-2026-12-02"
