"""Named kill points: places where the reliability suite SIGKILLs the whole run, to prove it resumes.

`reached("data.mindrecord.mid_file")` costs one environment lookup and does nothing in a normal run.
When `$LLM_PIPELINE_KILL_AT` names the point (optionally `point@N`: the N-th time any process of the
run reaches it), the process tree rooted at `$LLM_PIPELINE_KILL_ROOT` (the harness's child: the CLI,
the embedded API server, pool workers, msrun and its trainers) is SIGKILLed at once, this process last,
the way the OOM killer or a lost node ends a run: no `finally`, no atexit, no flush.

Before killing, the point's name is appended to `$LLM_PIPELINE_KILL_REPORT` so the harness can tell a
kill at the point from a crash elsewhere. A point fires once per report file: the count of passes and the
"already fired" mark live next to it, shared by every process of the run (pool workers, trainers).

This module imports nothing from the product (it is called from storage/ and from trainer processes)
and must stay cheap: `reached` is on hot-ish paths (per file, per checkpoint), never per record.
"""
from __future__ import annotations

import os
import signal
import threading

KILL_AT = "LLM_PIPELINE_KILL_AT"
KILL_ROOT = "LLM_PIPELINE_KILL_ROOT"
KILL_REPORT = "LLM_PIPELINE_KILL_REPORT"

# Every point the code exposes and where it sits; each row of the stage table adds its
# `<stage>.before_manifest` (stages.register). Points in code shared by pretrain and sft (checkpoints,
# resume) fire in whichever training stage reaches them first: the suite picks the stage by which
# upstream stages it lets finish before the kill.
POINTS: dict[str, str] = {
    "data.prep.between_shards": "data: a prep shard finished and marked, others not (prep step)",
    "data.dedup.between_partitions": "data: a dedup partition's pairs written and marked, others not (dedup step)",
    "data.after_tokenizer": "data: tokenizer trained and saved, nothing tokenized yet",
    "data.mindrecord.mid_file": "data: a MindRecord file half written (rows written, not committed)",
    "data.mindrecord.between_files": "data: a MindRecord file complete, the next one or the stats not",
    "data.dedup_index.mid_commit": "data: some partitions of the dedup index committed, others not",
    "checkpoint.mid_write": "trainer: MindSpore writing a checkpoint file (its .tmp half written)",
    "checkpoint.verify": "stage: a new checkpoint being verified (read in place, or loaded by MindSpore)",
    "checkpoint.before_latest": "stage: a checkpoint verified (sidecar written), latest_checkpoint.json not moved",
    "checkpoint.mid_upload": "stage: a checkpoint uploaded to the run store, its sidecar and pointer not",
    "train.resuming": "stage: resuming from a checkpoint, the trainer not yet relaunched",
    "sft.adapter.mid_save": "sft: adapter extraction running, adapter.ckpt not yet written",
    "evaluate.between_checkpoints": "evaluate: one checkpoint's generations written, the next not",
    "export.mid_merge": "export: LoRA merge half done (some modules merged)",
    "export.mid_mindir": "export: MindIR written, not yet reloaded and checked",
    "nightly.before_state_commit": "nightly: every stage done, the watermark/latest state not committed",
}


def _target() -> tuple[str, int] | None:
    want = os.environ.get(KILL_AT)
    if not want:
        return None
    name, _, nth = want.partition("@")
    return name, int(nth or 1)


def reached(name: str) -> None:
    """Kill the whole run here if the reliability suite asked for this point (see module docstring).
    Processes reaching the point at once (pool workers) may each report it before the tree is gone."""
    target = _target()
    if target is None or target[0] != name:
        return
    if name not in POINTS:
        raise KeyError(f"unknown kill point {name!r}: add it to pipeline_lib.killpoints.POINTS")
    report = os.environ.get(KILL_REPORT)
    if report and not _count_pass(report, name, target[1]):
        return
    _kill_tree(int(os.environ.get(KILL_ROOT) or os.getpid()))


def _count_pass(report: str, name: str, nth: int) -> bool:
    """True when this pass is the one to kill at (the nth, not fired before). Passes are counted in a
    file beside the report with O_APPEND writes, atomic between processes for lines this short."""
    if os.path.exists(report):
        return False  # already fired once: the rerun after the kill must run through
    counter = report + ".passes"
    fd = os.open(counter, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{name} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    with open(counter, encoding="utf-8") as f:
        passes = sum(1 for line in f if line.split(" ", 1)[0] == name)
    if passes < nth:
        return False
    fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{name} {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _kill_tree(root: int) -> None:
    """Freeze the tree, then kill it, this process last. Freezing first: a process forking while the tree
    is listed (a thread starting a server or a worker) would leave a child outside the list. This process
    ignores the termination signals first: it may have been started with a parent-death signal (workers,
    trainers), and dying of it halfway through the list would leave the rest of the tree frozen forever."""
    me = os.getpid()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    try:
        import psutil

        frozen: dict[int, psutil.Process] = {}
        for _ in range(10):
            try:
                top = psutil.Process(root)
                tree = ([top] if root != me else []) + top.children(recursive=True)
            except psutil.Error:
                break
            new = [p for p in tree if p.pid != me and p.pid not in frozen]
            if not new:
                break
            for proc in new:
                try:
                    proc.suspend()
                    frozen[proc.pid] = proc
                except psutil.Error:
                    pass
        # this process's ancestors last (a parent-death signal sent from a non-main thread's kill point
        # is not ignored): every other process is gone by then
        ancestors = {p.pid for p in psutil.Process(me).parents()}
        for proc in sorted(frozen.values(), key=lambda p: p.pid in ancestors):
            try:
                proc.kill()
            except psutil.Error:
                pass
    finally:
        os.kill(me, signal.SIGKILL)


class _KillAfterFirstWrite:
    """A checkpoint file being written: the point fires once some bytes are in it, so a half file is left."""

    def __init__(self, f, point: str):
        self._f, self._point = f, point

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def write(self, data):
        n = self._f.write(data)
        self._f.flush()
        reached(self._point)
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)


def arm_checkpoint_writes(point: str = "checkpoint.mid_write") -> None:
    """In a process that saves MindSpore checkpoints (trainer, adapter extraction): arm `point` inside
    MindSpore's own checkpoint writer, which has no hook of ours (it writes `<name>.tmp` and renames it
    when complete). No-op unless the suite asked for that point."""
    target = _target()
    if target is None or target[0] != point:
        return
    from mindspore.train import serialization

    # MindSpore registers its file system lazily, at the first save: register it now, or that
    # registration would overwrite the armed writer.
    ensure = getattr(serialization, "_ensure_ckpt_fs_initialized", None)
    if ensure is not None:
        ensure()
    fs = serialization._ckpt_fs
    original = fs.create

    def create(*args, **kwargs):
        return _KillAfterFirstWrite(original(*args, **kwargs), point)

    fs.create = create
