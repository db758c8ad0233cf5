"""The process tree of a child we started: its peak memory, and killing all of it.

- `ProcessTreeSampler(pid)` samples, in a background thread, the summed RSS of a process and all its
  descendants (msrun, its scheduler and workers) and keeps the peak. It also remembers every process it
  has seen, so a kill reaches workers that left the process group (msrun `setsid`s them), and the last
  non-zero sample (`last_rss_bytes`: the tree's memory just before it died, evidence for an OOM kill).
- `kill_tree(root, sampler)`: SIGTERM every tracked process and its process group, SIGKILL what is left
  after `grace_s`.

Limits: RSS summed over processes counts shared pages once per process, so the peak is an upper bound;
a process that lives shorter than the sampling interval is missed, and one that double-forks away between
two samples escapes the kill unless it stays in a tracked process group.
Raises nothing on vanished processes (they are skipped); ValueError for a non-positive interval.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import psutil


class ProcessTreeSampler:
    """Peak summed RSS of `pid` and its descendants, sampled every `interval` seconds while running."""

    def __init__(self, pid: int, interval: float = 0.5):
        if interval <= 0:
            raise ValueError(f"interval={interval!r}: must be > 0 seconds")
        self.pid, self.interval = pid, interval
        try:  # kept, not looked up again: psutil checks its create time, so a reused pid is never walked
            self._root: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._root = None
        self.peak_rss_bytes = 0
        self.last_rss_bytes = 0  # the last sample that saw the tree alive: what it held just before it ended
        self.samples = 0
        self.seen: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tree(self) -> list[psutil.Process]:
        try:
            if self._root is None or not self._root.is_running():
                return []
            return [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> int:
        """Take one sample now; returns the tree's current RSS in bytes (0 when the root is gone)."""
        total = 0
        procs = self._tree()
        for proc in procs:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                total += proc.memory_info().rss
            except psutil.Error:
                continue  # exited between listing and reading
        with self._lock:
            for proc in procs:
                self.seen.setdefault(proc.pid, proc)
            self.peak_rss_bytes = max(self.peak_rss_bytes, total)
            if total:
                self.last_rss_bytes = total
            self.samples += 1
        return total

    def seen_processes(self) -> list[psutil.Process]:
        """Every process seen in the tree so far (psutil objects guard against pid reuse)."""
        with self._lock:
            return list(self.seen.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self) -> "ProcessTreeSampler":
        self._thread = threading.Thread(target=self._run, name=f"rss-sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "ProcessTreeSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (False once it is gone)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(root: subprocess.Popen, sampler: ProcessTreeSampler, grace_s: float = 10.0) -> int:
    """SIGTERM every tracked process and its process group, SIGKILL what is left after `grace_s`.

    Returns the number of processes that were alive when the kill started.
    """
    own_group = os.getpgrp()

    def signal_all(sig: int) -> list[psutil.Process]:
        sampler.sample()  # pick up children started since the last sample
        procs = [p for p in sampler.seen_processes() if alive(p)]
        groups = set()
        for proc in procs:
            try:
                groups.add(os.getpgid(proc.pid))
            except OSError:
                pass
        for group in groups - {own_group}:
            try:
                os.killpg(group, sig)
            except OSError:
                pass
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        return procs

    first = signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in sampler.seen_processes()):
        root.poll()  # reap the direct child so it stops counting as alive
        time.sleep(0.05)
    if any(alive(p) for p in sampler.seen_processes()):
        signal_all(signal.SIGKILL)
        psutil.wait_procs([p for p in sampler.seen_processes() if alive(p)], timeout=5)
    root.wait()
    return len(first)
