"""Kill-point harness: run the tiny pipeline through the CLI, SIGKILL its whole process tree at a named
point (pipeline_lib.killpoints), rerun with the same run id, and check what a 3 a.m. crash must not break.

One uninterrupted run (`golden`) is the reference. A case that kills in stage S starts from a copy of the
golden run's folders of the stages before S (finished stages are cached by their manifests, so the case
pays only for S and what follows), kills at its point, then reruns the whole pipeline.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline_lib.killpoints import KILL_AT, KILL_REPORT, KILL_ROOT, POINTS
from pipeline_lib.stages import SPECS  # noqa: F401  (each row adds its <stage>.before_manifest to POINTS)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/pipelines/tiny-cpu.yaml"
STAGES = ["data", "pretrain", "sft", "evaluate", "export"]
# The shipped tiny default, shortened: checkpoints every 4 steps, no preflight (its own tests cover it).
OVERRIDES = ["training.steps=8", "training.save_steps=4", "training.warmup_steps=1", "training.preflight_steps=0",
             "sft.steps=6", "sft.warmup_steps=1", "evaluate.max_new_tokens=8"]


@dataclass
class Case:
    point: str
    stage: str  # the stage the kill lands in: the stages before it are copied from the golden run
    nth: int = 1  # the nth time the point is reached in the run
    then: str | None = None  # a second point for the first rerun (e.g. kill again while resuming)

    @property
    def name(self) -> str:
        return f"{self.stage}:{self.point}" + (f"@{self.nth}" if self.nth > 1 else "") + \
            (f"+{self.then}" if self.then else "")


@dataclass
class Attempt:
    returncode: int
    output: str
    killed_at: list[str] = field(default_factory=list)
    seconds: float = 0.0
    survivors: list[str] = field(default_factory=list)  # processes of a killed run still alive after it


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Pipeline:
    """The CLI on one output root, as a user runs it (relative config, from the repository)."""

    def __init__(self, root: Path, prefect_home: Path, run_id: str = "kp"):
        self.root, self.run_id = root, run_id
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("PREFECT_API_URL", "PYTEST", "LLM_PIPELINE_KILL"))}
        self.env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(prefect_home),
                        PREFECT_SERVER_ANALYTICS_ENABLED="false")

    @property
    def run_dir(self) -> Path:
        return self.root / self.run_id

    def run(self, kill: str | None = None, report: Path | None = None, timeout: float = 900,
            stages: tuple[str, ...] = STAGES) -> Attempt:
        picked = [] if tuple(stages) == tuple(STAGES) else ["--stages", ",".join(stages)]
        return self._cli(["run", CONFIG, "--run-id", self.run_id, *picked], kill, report, timeout)

    def nightly(self, date: str, inputs: str, kill: str | None = None, report: Path | None = None,
                timeout: float = 900) -> Attempt:
        return self._cli(["nightly", CONFIG, "--run-date", date, f"data.inputs=[{inputs}]"], kill, report, timeout)

    def _cli(self, args: list[str], kill: str | None, report: Path | None, timeout: float) -> Attempt:
        cli = str(Path(sys.executable).with_name("llm-pipeline"))
        env = dict(self.env)
        if kill:
            env.update({KILL_AT: kill, KILL_REPORT: str(report)})
        # exec keeps the shell's pid: the CLI itself is the root of the tree a kill point takes down
        cmd = ["sh", "-c", f'{KILL_ROOT}=$$ exec "$0" "$@"', cli, *args, f"run.output_root={self.root}", *OVERRIDES]
        adopt_orphans()
        before = {p.pid for p in _new_processes(set())}
        t = time.time()
        # Output to a file and a wait on the process, not on the end of a pipe: a process that outlived the
        # kill (what the test is there to catch) must fail the test with the tree it left, not hang it.
        log = self.root.parent / f"cli-{time.time_ns()}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                left = _new_processes(before)
                tree = "\n".join(_describe(p) for p in left)
                for p in left:
                    try:
                        p.kill()
                    except Exception:
                        pass
                raise AssertionError(f"llm-pipeline {args[0]} (kill={kill}) did not end within {timeout:g} s; "
                                     f"its processes:\n{tree}\nlast output:\n"
                                     f"{log.read_text(errors='replace')[-4000:]}") from None
        killed = report.read_text().split() if kill and report and report.exists() else []
        survivors = _survivors(before) if kill else []
        return Attempt(proc.returncode, log.read_text(errors="replace"), killed[::2], round(time.time() - t, 1),
                       survivors)

    def manifests(self) -> dict[str, bytes]:
        return {s: (self.run_dir / s / "manifest.json").read_bytes() for s in STAGES
                if (self.run_dir / s / "manifest.json").exists()}

    def partial_outputs(self) -> list[str]:
        """Outputs a finished stage's manifest lists that are missing or differ from their recorded sha256:
        what a later stage would read."""
        bad = []
        for stage, raw in self.manifests().items():
            for out in json.loads(raw)["outputs"]:
                path = self.run_dir / stage / out["path"]
                if not path.exists():
                    bad.append(f"{stage}/{out['path']}: missing")
                elif out.get("sha256") and sha256(path) != out["sha256"]:
                    bad.append(f"{stage}/{out['path']}: sha256 differs from the manifest")
        return bad

    def seed_from(self, golden: "Pipeline", upto: str) -> None:
        """Copy the golden run's finished stages before `upto` into this run's folder."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stage in STAGES[:STAGES.index(upto)]:
            shutil.copytree(golden.run_dir / stage, self.run_dir / stage, symlinks=True)


def adopt_orphans() -> None:
    """Make this process the subreaper of what it starts (Linux): a process of a killed run that escaped
    the kill is re-parented here instead of to init, so `_survivors` finds every one of them, whatever
    its session or command line (an unmanaged server started by a thread has neither our marker nor pgid)."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _new_processes(before: set[int]) -> list:
    """This process's descendants (orphans included: adopt_orphans) that were not there `before`."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before]


def _describe(proc) -> str:
    try:
        return f"{proc.pid} {proc.status()} {' '.join(proc.cmdline())[:200]}"
    except Exception:
        return f"{proc.pid} (gone)"


def _survivors(before: set[int], grace_s: float = 15.0) -> list[str]:
    """Processes started during the attempt and still alive `grace_s` after it ended (a server's own
    shutdown grace included), zombies reaped."""
    import psutil

    deadline = time.time() + grace_s
    while True:
        alive = []
        for proc in _new_processes(before):
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(proc.pid, os.WNOHANG)
                    continue
                alive.append(_describe(proc))
            except (psutil.Error, ChildProcessError):
                pass
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.5)


def still_running(marker: str) -> list[int]:
    """Pids of processes whose command line mentions `marker` (a leftover of a killed tree)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc.info["pid"])
        except psutil.Error:
            pass
    return found


def killed_by_sigkill(attempt: Attempt) -> bool:
    return attempt.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)


def known(case: Case) -> None:
    for p in (case.point, case.then):
        if p and p not in POINTS:
            raise KeyError(p)
