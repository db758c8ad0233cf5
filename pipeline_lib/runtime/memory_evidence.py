"""Was a SIGKILLed child killed for memory? The evidence the launcher records so the doctor need not guess.

SIGKILL is what the kernel's OOM killer sends, but also what a lost node's cleanup, a preempting scheduler or an
operator's `kill -9` send. Only evidence tells them apart:
- the cgroup's OOM-kill counter rose while the child ran: cgroup v2 `memory.events` (`oom_kill N`), cgroup v1
  `memory.oom_control` (same `oom_kill N` line, kernel >= 4.13). The counter is hierarchical (the kernel counts a kill
  in the victim's cgroup and every ancestor), so reading the cgroup of this process catches a kill of any child
  that stayed in it or below; a kill of another process of the same cgroup counts too, which is still memory
  pressure where the trainer ran;
- the process tree's RSS at the last sample before it died was near the memory limit (the smallest cgroup limit on
  the path, or the host's RAM when no cgroup limits it): `NEAR_LIMIT` of it.

`cgroup_memory(pid)` finds the files of a process's memory cgroup (from /proc/<pid>/cgroup). `MemoryEvidence` is
what one launch saw; `.verdict()` says (oom?, the sentence naming the evidence that decided).
`CGROUP_FS` is where the cgroup filesystem is mounted; `LLM_PIPELINE_CGROUP_FS` moves it (a container that mounts it
elsewhere). Raises nothing: missing or unreadable files mean "no evidence", never an exception.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

NEAR_LIMIT = 0.9    # tree RSS at or above this share of the limit just before the kill counts as memory pressure
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded LONG_MAX (9223372036854771712)
_OOM_KILL = re.compile(r"^oom_kill (\d+)$", re.M)
GB = 1 << 30


def cgroup_fs() -> Path:
    return Path(os.environ.get("LLM_PIPELINE_CGROUP_FS") or "/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupMemory:
    """The OOM-kill counter file and the effective memory limit of one process's memory cgroup."""
    events: Path | None        # memory.events (v2) or memory.oom_control (v1); None: not found
    limit_bytes: int | None    # smallest limit from the cgroup up to the root; None: no cgroup limit
    limit_file: Path | None    # the file that limit came from


def _membership(pid: int | str) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory path) from /proc/<pid>/cgroup lines `id:controllers:path`."""
    v2 = v1 = None
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None, None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return None if value >= _UNLIMITED else value


def _walk(base: Path, rel: str, events_name: str, limit_name: str) -> CgroupMemory | None:
    """The counter file of `base/rel` and the smallest limit on the way up to `base` (limits nest)."""
    rel = rel.strip("/")
    here = base / rel if rel else base
    events = here / events_name
    if not events.is_file():
        return None
    limit = limit_file = None
    node = here
    while True:
        value = _read_limit(node / limit_name)
        if value is not None and (limit is None or value < limit):
            limit, limit_file = value, node / limit_name
        if node == base or base not in node.parents:
            break
        node = node.parent
    return CgroupMemory(events, limit, limit_file)


def cgroup_memory(pid: int | str = "self") -> CgroupMemory:
    """Where `pid`'s memory cgroup keeps its OOM-kill count and limit (cgroup v2 first, then v1)."""
    root = cgroup_fs()
    v2, v1 = _membership(pid)
    found = None
    if v2 is not None:
        found = _walk(root, v2, "memory.events", "memory.max")
        if found is None:
            found = _walk(root / "unified", v2, "memory.events", "memory.max")  # hybrid hierarchy
    if found is None and v1 is not None:
        found = _walk(root / "memory", v1, "memory.oom_control", "memory.limit_in_bytes")
    return found or CgroupMemory(None, None, None)


def oom_kills(path: Path | None) -> int | None:
    """The `oom_kill N` count of a memory.events / memory.oom_control file; None when it has none or is unreadable."""
    if path is None:
        return None
    try:
        found = _OOM_KILL.search(Path(path).read_text())
    except OSError:
        return None
    return int(found.group(1)) if found else None


@dataclass
class MemoryEvidence:
    """What one launch saw of memory: the OOM-kill count before/after, the tree's last RSS, the limit."""
    events_path: str | None = None
    oom_kills_before: int | None = None
    oom_kills_after: int | None = None
    last_rss_bytes: int = 0
    limit_bytes: int | None = None
    limit_source: str = ""

    @classmethod
    def start(cls, pid: int | str = "self") -> "MemoryEvidence":
        """Before the child starts: the cgroup's count now and the limit the child will run under."""
        cg = cgroup_memory(pid)
        limit, source = cg.limit_bytes, str(cg.limit_file) if cg.limit_file else ""
        ram = psutil.virtual_memory().total
        if limit is None or ram < limit:
            limit, source = ram, "host RAM"
        return cls(str(cg.events) if cg.events else None, oom_kills(cg.events), None, 0, limit, source)

    def finish(self, last_rss_bytes: int) -> "MemoryEvidence":
        """After the child ended: the count again and the tree's RSS at its last sample."""
        self.oom_kills_after = oom_kills(Path(self.events_path)) if self.events_path else None
        self.last_rss_bytes = last_rss_bytes
        return self

    def verdict(self, rss: bool = True) -> tuple[bool, str]:
        """(the evidence shows memory pressure, the sentence saying what was checked and what decided).
        `rss=False` leaves out the RSS rule (for a failure that was not a kill, high RSS proves nothing)."""
        before, after = self.oom_kills_before, self.oom_kills_after
        if before is not None and after is not None and after > before:
            return True, (f"the cgroup's oom_kill count rose from {before} to {after} during the run "
                          f"({self.events_path})")
        rss = f"{self.last_rss_bytes / GB:.2f} GB"
        if rss and self.limit_bytes and self.last_rss_bytes >= NEAR_LIMIT * self.limit_bytes:
            return True, (f"the process tree's last sampled RSS, {rss}, was {self.last_rss_bytes / self.limit_bytes:.0%}"
                          f" of the {self.limit_bytes / GB:.2f} GB memory limit ({self.limit_source})")
        counter = (f"the cgroup's oom_kill count stayed at {after} ({self.events_path})" if after is not None
                   else "no cgroup oom_kill counter was readable")
        limit = f" of the {self.limit_bytes / GB:.2f} GB limit ({self.limit_source})" if self.limit_bytes else ""
        return False, f"no memory pressure: {counter}; last sampled RSS {rss}{limit}"
