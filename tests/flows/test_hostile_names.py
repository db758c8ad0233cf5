"""Run ids and run dates are names, never paths: refused where they enter, nothing written outside the root."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.storage import RunPaths
from pipeline_lib.storage.names import BadName

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["../../escaped", "/tmp/absolute-run", "..", "a/b", "", "-rf", "x" * 200, "nightly\n2026"]


@pytest.mark.parametrize("run_id", HOSTILE)
def test_a_run_folder_is_never_a_path(run_id):
    with pytest.raises(BadName) as caught:
        RunPaths("/srv/runs", run_id)
    assert caught.value.field == "run_id" and "Fix:" in str(caught.value)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=work, capture_output=True, text=True,
                          timeout=180, env={**__import__("os").environ, "PYTHONPATH": str(ROOT),
                                            "PREFECT_HOME": str(tmp_path / "prefect")})


def test_the_cli_refuses_hostile_ids_with_exit_2_and_writes_nothing(tmp_path):
    root = tmp_path / "work" / "runs"
    config = str(ROOT / "configs/pipelines/tiny-cpu.yaml")
    for args in (["run", config, "--stages", "data", "--run-id", "../../escaped", f"run.output_root={root}"],
                 ["status", config, "--run-id", "../escaped", f"run.output_root={root}"],
                 ["nightly", config, "--run-date", "../..", f"run.output_root={root}"],
                 ["nightly", config, "--run-date", "2026-13-45", f"run.output_root={root}"]):
        res = _cli(tmp_path, *args)
        assert res.returncode == 2, (args, res.stdout[-2000:], res.stderr[-2000:])
        assert ("--run-id=" in res.stderr or "--run-date=" in res.stderr) and "Fix:" in res.stderr, res.stderr
    assert not (tmp_path / "escaped").exists() and not root.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prefect", "work"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_nightly_promote_refuses_a_night_that_is_not_held(tmp_path):
    res = _cli(tmp_path, "nightly", "promote", str(ROOT / "configs/pipelines/tiny-cpu.yaml"), "--run-id",
               "nightly-2026-01-01", f"run.output_root={tmp_path / 'runs'}")
    assert res.returncode == 2 and "not a held night" in res.stderr and "held: none" in res.stderr, res.stderr
