"""The hang watchdog: the launcher polls it; when a rank finishes no step for too long it names the rank(s) that
stopped first, dumps every rank's Python stacks, and the launcher kills the trainer tree.

The limit (`limit_for`): `training.hang_timeout_s` when set (0 turns the watchdog off); else derived, HANG_FACTOR x
the median step time once HANG_WARMUP_STEPS steps after the first one were seen, and at least HANG_MIN_S (a
checkpoint save or an evaluation between two steps must not look like a hang). Before a rank's first step of a
launch (MindSpore compiles the graph in the first step; a resume also skips the consumed batches there) the limit
is at least HANG_COMPILE_FLOOR_S, counted from the launch; a rank whose training loop ended is not watched (the
final checkpoint save and the process teardown follow). training.timeout_seconds still bounds the whole launch.

Who stopped first (`first_stopped`): the ranks that got least far (heartbeat.progress: a rank stuck in its data
pipeline never begins the step its peers wait in); among several at the same place, a process that is stopped
(SIGSTOP, a debugger) or gone is the one that stopped. A rank with no heartbeat of this launch got least far.

Stacks (`dump_stacks`): `py-spy dump --pid P` when py-spy is on PATH (it also reads a stopped process); else
SIGUSR1, which train.entry registered with faulthandler (heartbeat.register_stack_dump); a stopped process runs no
handler, so its state is reported instead. All go to `hang/stacks_<n>.txt`; `report` holds what the session
records in hang.json (heartbeats, limit, first ranks, host, stacks file).

Nothing in a heartbeat file is trusted (anyone who can write the run folder can write one): the watchdog signals
and inspects only processes of the trainer tree the launcher started (`bind`: runtime.launcher's tree sampler; a
pid outside it is reported as FOREIGN and never signalled, SIGUSR1's default action kills), reads a rank's stacks
only from `<out>/stacks/pid_<P>.txt`, never through a link (heartbeat.parse_heartbeat drops the file's own
`stack_file`), and leaves out a malformed heartbeat with a warning (heartbeat.read_heartbeats): a bad file never
stops training.
"""
from __future__ import annotations

import os
import shutil
import stat
import statistics
import time
from pathlib import Path

import psutil

from ..runtime.launcher import launch
from ..runtime.process_tree import ProcessTreeSampler, alive
from .heartbeat import STACK_SIGNAL, STACKS_DIR, progress, read_heartbeats, stack_path

HANG_LINE = "[watchdog] hang: "  # doctor/patterns.py: category hang
HANG_FACTOR = 10.0
HANG_MIN_S = 600.0
HANG_COMPILE_FLOOR_S = 1800.0
HANG_WARMUP_STEPS = 3
STACK_WAIT_S = 5.0
FOREIGN = "not in the trainer's process tree"  # the state of a heartbeat's pid the launcher did not start
MAX_STACK_BYTES = 4 * 1024 * 1024  # what one dump may add to a stacks file (a few threads: a few KB)


def process_state(pid: int | None) -> str:
    """psutil's status of `pid` ("running", "sleeping", "stopped", "zombie", ...) or "gone"."""
    if pid is None:
        return "gone"
    try:
        return psutil.Process(int(pid)).status()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return "gone"


def _stopped(state: str) -> bool:
    return state in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE, "gone", FOREIGN)


def first_stopped(beats: dict[int, dict], ranks: list[int], states: dict[int, str]) -> list[int]:
    """The ranks that stopped first (see the module docstring)."""
    where = {r: progress(beats[r]) if r in beats else (-1, 0) for r in ranks}
    least = min(where.values())
    first = [r for r in ranks if where[r] == least]
    halted = [r for r in first if _stopped(states.get(r, "gone"))]
    return halted or first


def dump_stacks(beats: dict[int, dict], states: dict[int, str], dest: Path,
                procs: dict[int, psutil.Process] | None = None, out: Path | None = None) -> Path:
    """Every rank's Python stacks (or why there is none) into `dest`; returns it. `procs`: {rank: its process},
    those of the trainer tree only: no other rank is signalled or read. `out`: the run's output_dir, the only
    place stack files are read from (stack_path of the rank's pid)."""
    procs = procs or {}
    out = Path(out) if out is not None else dest.parent.parent
    spy = shutil.which("py-spy")
    marks = {}
    if spy is None:
        for rank, beat in beats.items():
            marks[rank] = _stack_size(out, beat.get("pid"))
            if rank in procs and not _stopped(states[rank]):
                try:
                    procs[rank].send_signal(STACK_SIGNAL)  # psutil: never a process that got the pid since
                except psutil.Error:
                    pass
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and any(_grew(out, beats[r], marks[r]) is None for r in marks
                                                  if r in procs and not _stopped(states[r])):
            time.sleep(0.2)
        time.sleep(0.3)  # faulthandler writes thread by thread: let the last one land
    parts = []
    for rank in sorted(beats):
        beat, state = beats[rank], states[rank]
        head = f"=== rank {rank} pid {beat.get('pid')} host {beat.get('host')} state {state} ==="
        if rank not in procs:
            body = f"no stack: pid {beat.get('pid')} is {state} (never signalled nor read)"
        elif spy is not None:
            said: list[str] = []
            run = launch([spy, "dump", "--pid", str(procs[rank].pid)], cwd=None, timeout_s=60, on_line=said.append,
                         grace_s=1)
            body = "\n".join(said) + ("" if run.ok else f"\n(py-spy {run.how()})")
        elif _stopped(state):
            body = (f"no stack: the process is {state} (a stopped process runs no signal handler; install py-spy "
                    "to read it anyway)")
        else:
            body = _grew(out, beat, marks[rank]) or f"no stack: nothing written to {beat.get('stack_file')} " \
                                                    f"within {STACK_WAIT_S:g}s of SIGUSR1"
        parts.append(f"{head}\n{body.rstrip()}\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{dest.name}")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    os.replace(tmp, dest)
    return dest


def _open_stack(out: Path, pid) -> int | None:
    """A read-only fd of the rank's stack file in this run's folder (stacks/pid_<pid>.txt), None when there is no
    regular file there or the folder or the file is a link (a link could point anywhere: it is not followed)."""
    if not pid or (out / STACKS_DIR).is_symlink():
        return None
    try:
        fd = os.open(stack_path(out, pid), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _stack_size(out: Path, pid) -> int:
    fd = _open_stack(out, pid)
    if fd is None:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _grew(out: Path, beat: dict, mark: int) -> str | None:
    """What faulthandler appended to the rank's stack file since `mark` (at most MAX_STACK_BYTES), or None."""
    fd = _open_stack(out, beat.get("pid"))
    if fd is None:
        return None
    try:
        if os.fstat(fd).st_size <= mark:
            return None
        os.lseek(fd, mark, os.SEEK_SET)
        return os.read(fd, MAX_STACK_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


class HangWatchdog:
    """Polled by runtime.launcher.launch (`watchdog=`): None while training moves, the lines that say what hung
    once it does not (the launcher then kills the tree). `out` is the trainer's output_dir, `ranks` the ranks this
    node runs, `timeout_s` training.hang_timeout_s (None: derived; 0: off); `attempt` numbers the stacks file."""

    def __init__(self, out: str | Path, ranks: list[int], timeout_s: float | None, attempt: int = 1, log=print):
        self.out, self.ranks, self.setting, self.attempt = Path(out), list(ranks), timeout_s, attempt
        self.log = log
        self.sampler: ProcessTreeSampler | None = None  # the trainer's tree (bind); unbound: nothing is signalled
        self._warned: set[str] = set()
        self.start = time.time()
        self.step_times: list[float] = []
        self._last: tuple[int, float] | None = None  # (step, step_end) of the lowest rank at the previous poll
        self.report: dict | None = None

    def bind(self, sampler: ProcessTreeSampler) -> None:
        """runtime.launcher's on_start: the trainer tree the launcher started, the only processes signalled."""
        self.sampler = sampler

    def _warn(self, problem: str) -> None:
        if problem not in self._warned:  # once each: the watchdog polls every second
            self._warned.add(problem)
            self.log(f"[watchdog] WARNING: {problem}")

    def _tree_process(self, pid) -> psutil.Process | None:
        """The live process `pid` of the trainer tree (psutil's object: a reused pid is never it), else None."""
        if self.sampler is None or not pid:
            return None
        self.sampler.sample()  # children started since the last sample
        return next((p for p in self.sampler.seen_processes() if p.pid == pid and alive(p)), None)

    def _read(self) -> dict[int, dict]:
        problems: list[str] = []
        beats = read_heartbeats(self.out, since=self.start, problems=problems)
        for problem in problems:
            self._warn(f"heartbeat ignored: {problem}")
        return beats

    def limit_for(self, started: bool) -> tuple[float, str]:
        """(seconds without a finished step that make a hang, why that many)."""
        if self.setting:
            if started:
                return float(self.setting), "training.hang_timeout_s"
            return max(float(self.setting), HANG_COMPILE_FLOOR_S), \
                f"before the first step: at least {HANG_COMPILE_FLOOR_S:g}s for graph compile"
        if started and len(self.step_times) >= HANG_WARMUP_STEPS:
            median = statistics.median(self.step_times)
            return max(HANG_MIN_S, HANG_FACTOR * median), \
                f"derived: {HANG_FACTOR:g} x the median step time {median:.2f}s, at least {HANG_MIN_S:g}s"
        return HANG_COMPILE_FLOOR_S, f"before {HANG_WARMUP_STEPS} timed steps: {HANG_COMPILE_FLOOR_S:g}s"

    def _learn(self, beats: dict[int, dict]) -> None:
        if not beats:
            return
        beat = beats[min(beats)]
        step, end = int(beat.get("step") or 0), beat.get("step_end")
        if end is None:
            return
        if self._last is not None and step > self._last[0] and self._last[1] is not None:
            # the first step of a launch compiles: only intervals between two steps of this launch count
            self.step_times.append((end - self._last[1]) / (step - self._last[0]))
        if self._last is None or step != self._last[0]:
            self._last = (step, end)

    def __call__(self) -> list[str] | None:
        if self.setting == 0 or self.report is not None:
            return None
        beats = self._read()
        self._learn(beats)
        now = time.time()
        stale = {}
        for rank in self.ranks:
            if (beats.get(rank) or {}).get("ended"):
                continue  # its training loop is over: the final save and the teardown are no step
            end = (beats.get(rank) or {}).get("step_end")
            limit, why = self.limit_for(started=end is not None)
            idle = now - (end if end is not None else self.start)
            if idle > limit:
                stale[rank] = (idle, limit, why)
        if not stale:
            return None
        return self._hung(beats, stale)

    def _hung(self, beats: dict[int, dict], stale: dict) -> list[str]:
        procs, states = {}, {}
        for r in self.ranks:
            pid = (beats.get(r) or {}).get("pid")
            proc = self._tree_process(pid)
            if proc is not None:
                try:
                    procs[r], states[r] = proc, proc.status()
                except psutil.Error:
                    states[r] = "gone"
            else:
                states[r] = "gone" if pid is None or not psutil.pid_exists(pid) else FOREIGN
                if states[r] == FOREIGN:
                    self._warn(f"rank {r}'s heartbeat names pid {pid}, which is not a process of the trainer's tree: "
                               "it is neither signalled nor read")
        first = first_stopped(beats, self.ranks, states)
        stacks = dump_stacks({r: b for r, b in beats.items() if r in self.ranks}, states,
                             self.out / "hang" / f"stacks_{self.attempt}.txt", procs, self.out)
        idle, limit, why = max(stale.values())
        hosts = sorted({(beats.get(r) or {}).get("host") or "unknown" for r in first})

        def at(rank):
            b = beats.get(rank)
            if b is None:
                return f"rank {rank}: no heartbeat in this launch (state {states[rank]})"
            doing = f", running step {b['running']}" if b.get("running") is not None else ", between steps"
            return f"rank {rank}: step {b.get('step')} done{doing} (state {states[rank]})"

        step = min(int((beats.get(r) or {}).get("step") or 0) for r in first)
        lines = [f"{HANG_LINE}no training step finished for {idle:.0f}s (limit {limit:g}s, {why}); stopped first: "
                 f"rank(s) {', '.join(map(str, first))} on host {', '.join(hosts)} after step {step}. "
                 f"Python stacks of every rank: {stacks}"]
        lines += [f"{HANG_LINE}{at(r)}" for r in self.ranks]
        log = self.out / "hang" / f"hang_{self.attempt}.log"  # where `llm-pipeline doctor --run-id` reads it
        log.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.report = {"step": step, "log": str(log), "first_ranks": first, "hosts": hosts, "idle_s": round(idle, 1),
                       "limit_s": limit, "limit_why": why, "stacks": str(stacks), "time": time.time(),
                       "ranks": {str(r): {**(beats.get(r) or {}), "state": states[r]} for r in self.ranks}}
        return lines
