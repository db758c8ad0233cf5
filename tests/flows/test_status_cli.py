"""`llm-pipeline status CONFIG --run-id ID`: a run id that names no run is an error listing the known ones (a typo
listed every stage as 'not complete', exit 0), and the columns are labelled."""
from pathlib import Path

from flows.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/pipelines/tiny-cpu.yaml")


def test_an_unknown_run_id_exits_2_naming_the_known_runs(capsys, tmp_path):
    root = tmp_path / "runs"
    (root / "run-a" / "logs").mkdir(parents=True)
    (root / "run-a" / "logs" / "data-20261204-120000.log").write_text("data: started\n")
    (root / "nightly-2026-12-01" / "data").mkdir(parents=True)
    (root / "nightly-2026-12-01" / "data" / "manifest.json").write_text("{}")
    (root / "_dedup_index" / "tiny-cpu" / "x").mkdir(parents=True)  # not a run
    (root / "_dedup_index" / "tiny-cpu" / "x" / "manifest.json").write_text("{}")
    assert main(["status", TINY, f"run.output_root={root}", "--run-id", "run-b"]) == 2
    err = capsys.readouterr().err
    assert "--run-id run-b: no such run under run.output_root=" in err
    assert "known run ids (2): nightly-2026-12-01, run-a." in err

    assert main(["status", TINY, f"run.output_root={root}", "--run-id", "run-a"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["stage", "state", "detail"]
    assert [ln.split()[0] for ln in lines[1:6]] == ["data", "pretrain", "sft", "evaluate", "export"]


def test_an_empty_output_root_says_it_holds_no_run(capsys, tmp_path):
    assert main(["status", TINY, f"run.output_root={tmp_path / 'none'}", "--run-id", "run-a"]) == 2
    assert "it holds no run" in capsys.readouterr().err
