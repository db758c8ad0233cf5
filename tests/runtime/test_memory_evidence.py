"""The memory evidence of a launch: the cgroup's OOM-kill counter and limit, found from /proc/<pid>/cgroup."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline_lib.runtime.memory_evidence import MemoryEvidence, cgroup_memory, oom_kills


def _membership() -> dict[str, str]:
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, controllers, path = line.split(":", 2)
        out["v2" if num == "0" and not controllers else controllers] = path
    return out


def test_the_cgroup_of_this_process_is_found_on_v1_or_v2(tmp_path, monkeypatch):
    """A v1 memory hierarchy (memory.oom_control, memory.limit_in_bytes), laid out where /proc/self/cgroup says this
    process is: the counter is read and the smallest limit on the way up is the limit."""
    groups = _membership()
    if groups.get("v2", "/") != "/" or not any("memory" in c.split(",") for c in groups):
        pytest.skip("not a v1 memory hierarchy: the v2 layout is tested in tests/doctor/test_stage_failure.py")
    rel = next(p for c, p in groups.items() if "memory" in c.split(",")).strip("/")
    monkeypatch.setenv("LLM_PIPELINE_CGROUP_FS", str(tmp_path))
    here = tmp_path / "memory" / rel
    here.mkdir(parents=True)
    (here / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (here / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{8 << 30}\n")
    cg = cgroup_memory()
    assert cg.events == here / "memory.oom_control" and oom_kills(cg.events) == 3
    assert cg.limit_bytes == 8 << 30 and cg.limit_file == tmp_path / "memory" / "memory.limit_in_bytes"


def test_without_a_counter_there_is_no_evidence_and_no_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_PIPELINE_CGROUP_FS", str(tmp_path / "nothing"))
    ev = MemoryEvidence.start().finish(1 << 20)
    assert ev.events_path is None and ev.limit_source == "host RAM"
    oom, why = ev.verdict()
    assert not oom and "no cgroup oom_kill counter was readable" in why
    assert oom_kills(tmp_path / "missing") is None
