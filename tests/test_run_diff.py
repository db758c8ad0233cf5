"""What changed between two runs (pipeline_lib/run_diff.py, `llm-pipeline diff`, flows/night_changes.py) on two real
run folders: run A is the pretraining tests' session data run (pretrain_fixtures.pretrain_data: the real data stage
on the bundled corpus); run B is a real data stage on other files (new documents, copies of A's, too-short lines)
continuing A's lineage with A's tokenizer. Each gets a real evaluate stage (the tiny Llama of pretrain_fixtures'
shape, random-init weights: A and B evaluate different weights under the same label)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "train"))
from pretrain_fixtures import CORPUS, new_run  # noqa: E402
from random_init import random_llama_params, save_params  # noqa: E402

from pipeline_lib.run_diff import RunNotFound, diff_runs, top_reasons  # noqa: E402

pytestmark = pytest.mark.slow
EVAL = {"max_new_tokens": 4, "prompt_files": ["configs/eval/domain_qa.jsonl", "configs/eval/open_chat.jsonl"],
        "reference_max_rows": 4, "perplexity_max_rows": 8}


def _good_lines() -> list[str]:
    out = []
    for raw in CORPUS.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("text"), str) and len(rec["text"]) > 80:
            out.append(raw)
    return out


@pytest.fixture(scope="module")
def two_runs(pretrain_data, tmp_path_factory):
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.stages import run_stage

    import shutil

    from pretrain_fixtures import PretrainData

    tmp = tmp_path_factory.mktemp("diff_inputs")
    # the lineage in an output root of its own: B's data stage adds a segment to the dedup index, which the
    # session's other tests on pretrain_data's root (test_replay counts its segments) must not see
    own = tmp_path_factory.mktemp("diff_lineage")
    shutil.copytree(pretrain_data.data_dir, own / "runs" / "data-run" / "data")
    shutil.copytree(pretrain_data.root / "runs" / "_dedup_index", own / "runs" / "_dedup_index")
    data = PretrainData(own, own / "runs" / "data-run" / "data", pretrain_data.rows_train)
    a_tok = data.data_dir / "tokenizer" / "tokenizer.model"
    lines = _good_lines()
    texts = [json.loads(x)["text"] for x in lines]
    new = [json.dumps({"id": f"new-{i}", "text": texts[i] + texts[i + 50]}, ensure_ascii=False) for i in range(40)]
    (tmp / "new.jsonl").write_text("\n".join(new) + "\n", encoding="utf-8")  # two of A's documents in one: new
    (tmp / "mixed.jsonl").write_text("\n".join(lines[:5] + [json.dumps({"text": "ok"})] * 3) + "\n", encoding="utf-8")
    ckpts = {}
    for seed in (0, 1):
        cfg_m, _ = new_run(data, "diff-probe")
        ckpts[seed] = save_params(random_llama_params(cfg_m.model, seed=seed), tmp / f"weights-{seed}.ckpt")
    cfg_a, paths_a = new_run(data, "diff-a", evaluate={**EVAL, "compare_checkpoints": {"candidate": str(ckpts[0])}})
    run_stage(cfg_a, paths_a, "evaluate")
    # B: another night of the lineage: its own files, deduplicated against A, A's tokenizer
    cfg_b, paths_b = new_run(data, "diff-b", tokenizer={"path": str(a_tok)},
                             evaluate={**EVAL, "compare_checkpoints": {"candidate": str(ckpts[1])}})
    raw = cfg_b.model_dump(mode="json")
    raw["data"]["inputs"] = [str(tmp / "new.jsonl"), str(tmp / "mixed.jsonl")]
    cfg_b = config_from_dict(raw)
    shutil.rmtree(paths_b.stage_uri("data"))  # new_run copied A's data stage in; B runs its own
    run_stage(cfg_b, paths_b, "data", workers=1)
    run_stage(cfg_b, paths_b, "evaluate")
    return cfg_b, paths_a, paths_b


def _json(path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def test_the_diff_of_two_real_runs(two_runs):
    cfg, a, b = two_runs
    diff = diff_runs(cfg, a.run_id, b.run_id)
    stats_a, stats_b = _json(f"{a.stage_uri('data')}/stats.json"), _json(f"{b.stage_uri('data')}/stats.json")
    # documents per source file of each run, from each run's stats.json
    rows = {(r["run"], r["file"]): r for r in diff.data_rows()}
    assert set(rows) == {("diff-a", "tiny_corpus.jsonl"), ("diff-b", "new.jsonl"), ("diff-b", "mixed.jsonl")}
    for run_id, stats in (("diff-a", stats_a), ("diff-b", stats_b)):
        for entry in stats["files"].values():
            row = rows[(run_id, Path(entry["uri"]).name)]
            assert (row["read"], row["kept"]) == (entry["read"], entry["kept"])
            assert row["read"] == row["kept"] + row["excluded"] + row["duplicated"]  # stats.json balances
    mixed = rows[("diff-b", "mixed.jsonl")]
    assert mixed["read"] == 8 and mixed["kept"] == 0  # 5 documents A kept, 3 too short: nothing new
    assert mixed["top reasons"].startswith("exact duplicates 5") and "too_short" in mixed["top reasons"]
    assert rows[("diff-a", "tiny_corpus.jsonl")]["excluded"] > 0  # the planted malformed and filtered lines
    totals = {r[""]: r for r in diff.total_rows()}
    assert totals["read"]["diff-a"] == f"{stats_a['total']['read']:,}"
    assert totals["training tokens"]["change"] == f"{stats_b['total']['tokens_train'] - stats_a['total']['tokens_train']:+,}"
    mix = {(r["run"], r["source"]): r for r in diff.mix_rows()}
    assert mix[("diff-b", "new.jsonl")]["share"] == "100.0%" and mix[("diff-b", "mixed.jsonl")]["share"] == "0.0%"

    # every perplexity and task score of the label both runs evaluated, side by side
    ev_a, ev_b = _json(f"{a.stage_uri('evaluate')}/metrics.json"), _json(f"{b.stage_uri('evaluate')}/metrics.json")
    ck_a, ck_b = ev_a["checkpoints"][0], ev_b["checkpoints"][0]
    metrics = {r["metric"]: r for r in diff.metric_rows() if r["checkpoint"] == "candidate"}
    assert list(metrics) == ["held-out perplexity (each run's own split)", "general_zh perplexity", "domain_choice accuracy",
                             "domain_classify accuracy"]
    ref_a, ref_b = ck_a["reference"]["general_zh"]["perplexity"], ck_b["reference"]["general_zh"]["perplexity"]
    assert metrics["general_zh perplexity"]["B vs A"] == f"{ref_b / ref_a - 1:+.2%}" and ref_a != ref_b
    acc_a, acc_b = ck_a["tasks"]["domain_choice"]["accuracy"], ck_b["tasks"]["domain_choice"]["accuracy"]
    assert metrics["domain_choice accuracy"]["diff-a"] == f"{acc_a:.4g}"
    assert metrics["domain_choice accuracy"]["B vs A"] == f"{acc_b - acc_a:+.3f}"

    # the fixed prompts whose answers changed, A's answer above B's
    gens = {run.run_id: {r["prompt_id"]: r["text"] for r in map(json.loads, open(
        f"{run.stage_uri('evaluate')}/candidate/generations.jsonl", encoding="utf-8"))} for run in (a, b)}
    changed = [pid for pid in gens["diff-b"] if gens["diff-b"][pid] != gens["diff-a"][pid]]
    assert changed and [c["prompt_id"] for c in diff.changed_answers()] == changed
    assert diff.unchanged_count() == len(gens["diff-b"]) - len(changed)
    md = diff.markdown()
    first = changed[0]
    block = md[md.index(f"### {first} "):]
    assert block.index("**candidate, A** (diff-a)") < block.index("**candidate, B** (diff-b)")
    # readable in a 1,600 px window: no table wider than ~7 columns or ~190 characters (the answers are paragraphs)
    table_lines = [line for line in md.splitlines() if line.startswith("|")]
    assert max(line.count("|") for line in table_lines) <= 8 and max(map(len, table_lines)) < 190


def test_top_reasons_rank_rejected_filtered_and_duplicates():
    entry = {"rejected": {"bad_json": 1}, "filtered": {"too_short": 4, "url_heavy": 2}, "exact_duplicates": 3,
             "near_duplicates": 0}
    assert top_reasons(entry) == "too_short 4, exact duplicates 3, url_heavy 2"
    assert top_reasons({}) == "–"


def test_the_cli_prints_and_writes_the_diff_and_refuses_bad_run_ids(two_runs, tmp_path, capsys):
    from flows.cli import main

    cfg, a, b = two_runs
    root = f"run.output_root={cfg.run.output_root}"
    out = tmp_path / "changes.md"
    assert main(["diff", "configs/pipelines/tiny-cpu.yaml", "--run-id", a.run_id, "--run-id", b.run_id, root,
                 "--out", str(out), "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert out.read_text(encoding="utf-8").strip() == printed.strip()
    assert "# What changed: diff-a -> diff-b" in printed and "<summary>Answers that changed (" in printed
    assert main(["diff", "configs/pipelines/tiny-cpu.yaml", "--run-id", a.run_id, "--run-id", b.run_id, root]) == 0
    terminal = capsys.readouterr().out  # plain text: the answers' <br> and the labels' ** are markdown
    assert "What changed: diff-a -> diff-b\n=" in terminal and "<br>" not in terminal and "**" not in terminal
    assert main(["diff", "configs/pipelines/tiny-cpu.yaml", "--run-id", a.run_id, root]) == 2
    assert "give it twice" in capsys.readouterr().err
    assert main(["diff", "configs/pipelines/tiny-cpu.yaml", "--run-id", a.run_id, "--run-id", "nope", root]) == 2
    err = capsys.readouterr().err
    assert "--run-id nope" in err and "no data/stats.json and no evaluate/metrics.json" in err
    assert main(["diff", "configs/pipelines/tiny-cpu.yaml", "--run-id", "../up", "--run-id", b.run_id, root]) == 2
    with pytest.raises(RunNotFound):
        diff_runs(cfg, "absent", b.run_id)


@pytest.mark.e2e
@pytest.mark.usefixtures("prefect_server")
def test_the_night_publishes_what_changed_against_the_promoted_run(two_runs):
    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.night_changes import KEY, publish_night_changes

    cfg, a, b = two_runs

    @flow(name="night-changes-probe")
    def probe(first: bool):
        return publish_night_changes(cfg, None if first else a.run_id, b.run_id)

    text = probe(False)
    written = Path(b.run_uri, "changes.md").read_text(encoding="utf-8")
    assert written == text and text.startswith(f"# What changed tonight: {b.run_id} against the promoted {a.run_id}")

    async def latest():
        async with get_client() as client:
            return await client.read_latest_artifacts()
    import asyncio

    arts = [x for x in asyncio.run(latest()) if x.key == KEY]
    assert arts and arts[0].data == text
    assert "Nothing promoted before this night" in probe(True)


def test_a_corrupt_run_folder_is_a_clear_error_exit_2(tmp_path, capsys):
    """Issue 45 items 3 and 10: JSONDecodeError and TypeError tracebacks; a checkpoint `dir` joined into a path."""
    from pipeline_lib.cli import diff_main

    root = tmp_path / "runs"
    good = {"files": {}, "total": {}}
    for run, stats in (("a", good), ("b", good)):
        (root / run / "data").mkdir(parents=True)
        (root / run / "data" / "stats.json").write_text(json.dumps(stats))
    tiny = str(Path(__file__).resolve().parents[1] / "configs/pipelines/tiny-cpu.yaml")

    def diff() -> tuple[int, str]:
        code = diff_main([tiny, f"run.output_root={root}", "--run-id", "a", "--run-id", "b"])
        return code, capsys.readouterr().err

    cases = [("not json {", "data/stats.json: not JSON"),
             ("[1, 2]", "a JSON list, not the object its stage writes"),
             ('{"files": {"x": 5}, "total": 3}', "not of the shape its stage writes"),
             ("[" * 100_000, "not JSON (RecursionError")]
    for text, said in cases:
        (root / "b" / "data" / "stats.json").write_text(text)
        code, err = diff()
        assert code == 2 and said in err and "Fix:" in err and "Traceback" not in err, (text[:20], err)
    (root / "b" / "data" / "stats.json").write_text(json.dumps(good))
    (root / "b" / "evaluate").mkdir()
    (root / "b" / "evaluate" / "metrics.json").write_text(json.dumps({"checkpoints": [{"label": "x", "dir": "../../.."}]}))
    code, err = diff()
    assert code == 2 and "has a `dir` that is not a folder name ('../../..')" in err
    with open(root / "b" / "evaluate" / "metrics.json", "wb") as fh:
        fh.truncate(1 << 30)  # sparse: refused by its size, not read
    code, err = diff()
    assert code == 2 and "larger than 16 MiB" in err
