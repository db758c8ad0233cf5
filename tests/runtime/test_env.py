"""The one subprocess environment builder: a child started from any cwd imports this repository's
pipeline_lib, keeps the caller's PYTHONPATH and GLOG_v, and writes MindSpore logs under log_dir."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline_lib.runtime.env import PROJECT_ROOT, subprocess_env


def test_child_imports_this_repository_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.setenv("GLOG_v", "1")
    env = subprocess_env(log_dir=tmp_path / "logs", extra={"X_EXTRA": "1"})
    assert env["PYTHONPATH"].split(":") == [str(PROJECT_ROOT), "/somewhere/else"]
    assert env["GLOG_v"] == "1" and env["PYTHONUNBUFFERED"] == "1" and env["X_EXTRA"] == "1"
    assert env["LOG_MF_PATH"] == str(tmp_path / "logs" / "mindformers")
    assert env["MS_OM_PATH"] == str(tmp_path / "logs" / "ms_om")
    out = subprocess.run([sys.executable, "-c", "import pipeline_lib, os; print(pipeline_lib.__file__)"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out).parent == PROJECT_ROOT / "pipeline_lib"


def test_defaults_without_log_dir(monkeypatch):
    monkeypatch.delenv("GLOG_v", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("LOG_MF_PATH", raising=False)
    env = subprocess_env()
    assert env["GLOG_v"] == "3" and env["PYTHONPATH"] == str(PROJECT_ROOT) and "LOG_MF_PATH" not in env
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_the_compile_cache_of_the_users_shell_does_not_reach_a_child(monkeypatch):
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", "/tmp/somewhere")
    env = subprocess_env(extra={"GLOG_v": "2"})
    assert "MS_COMPILER_CACHE_ENABLE" not in env and "MS_COMPILER_CACHE_PATH" not in env
