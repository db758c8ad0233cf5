"""The environment of every subprocess the pipeline starts (workers, trainers, MindSpore tools).

`subprocess_env(log_dir=..., extra=...)`: os.environ plus
- this repository first on PYTHONPATH (children run `python -m pipeline_lib...` from any cwd),
- this interpreter's folder first on PATH (msrun starts `python` by name),
- PYTHONUNBUFFERED=1 (progress lines arrive as they are printed),
- GLOG_v=3 unless the caller set it (MindSpore's C++ INFO logs off),
- with `log_dir`: LOG_MF_PATH / MS_OM_PATH under it (mindformers and MindSpore write log files there
  instead of ./output and the home folder),
- MindSpore's graph compile cache off (MS_COMPILER_CACHE_ENABLE / MS_COMPILER_CACHE_PATH dropped, also when the
  user's shell sets them): MindSpore keys that cache on the network's Python source, not on the yaml, so a launch
  loads a graph compiled for another yaml (docs/mindformers-facts.md),
- `extra` last (it wins).
One builder, so a child started by any stage finds the same code and writes its logs the same way.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Measured (tiny default, CPU): with the cache on, the 60-step training after its 5-step preflight loaded the
# preflight's graph, learning-rate schedule included; its loss stayed at 7.2 instead of falling to 3.7.
COMPILE_CACHE_VARS = ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")


def subprocess_env(*, log_dir: str | Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if x)
    env["PATH"] = os.pathsep.join(x for x in (os.path.dirname(sys.executable), env.get("PATH")) if x)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("GLOG_v", "3")
    for key in COMPILE_CACHE_VARS:
        env.pop(key, None)
    if log_dir is not None:
        env["LOG_MF_PATH"] = str(Path(log_dir) / "mindformers")
        env["MS_OM_PATH"] = str(Path(log_dir) / "ms_om")
    env.update(extra or {})
    return env
