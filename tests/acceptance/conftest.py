"""Run the product the way a user does: from a copy of the repository in a temporary folder,
with the README's commands, the shipped configs and relative paths.

The copy holds exactly the tracked files (what `git clone` gives) and reuses the installed
`.venv` through a symlink, so these tests cost minutes, not an install. `PYTHONPATH` points at
the copy, so the copy's code runs (the editable install would otherwise import the original).
Each copy gets its own PREFECT_HOME (a user's ~/.prefect) and no PREFECT_API_URL: `llm-pipeline`
starts its embedded API exactly as it does for a user.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from suite_rules import machine_skip

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)
USER_ENV = ("PATH", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR", "TZ")


def tracked_files(root: Path) -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
        return [p for p in out.decode().split("\0") if p and (root / p).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but build output
        skip = {".venv", ".git", "runs", "output", "__pycache__", ".pytest_cache"}
        return [str(p.relative_to(root)) for p in root.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(root).parts)]


WALK = re.compile(r"^<!-- walk\b[^\n]*-->\n```(?:bash)?\n(.*?)^```", re.S | re.M)


def readme_walk(root: Path = ROOT) -> list[str]:
    """The lines of the README's blocks marked `<!-- walk ... -->`, in order, as written (a comment after a command
    stays: bash ignores it); blank lines and whole-line comments left out."""
    blocks = WALK.findall((root / "README.md").read_text(encoding="utf-8"))
    return [ln for block in blocks for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def readme_commands(root: Path = ROOT) -> dict[str, str]:
    """{'demo': 'make demo', 'test': 'make test'}: the commands in the README's first code block."""
    block = re.search(r"```\n(.*?)```", (root / "README.md").read_text(encoding="utf-8"), re.S).group(1)
    cmds = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    return {c.split()[-1]: c for c in cmds}


class UserRepo:
    """A fresh copy of the repository and a way to run commands in it as a user would."""

    def __init__(self, path: Path, home: Path):
        self.path, self.home = path, home
        # a user's shell, not the suite's: none of the suite's LOG_MF_PATH / MS_OM_PATH / GLOG_v / PREFECT_* /
        # AWS_* settings, so litter a user's run would leave in the checkout shows here (leftovers())
        self.env = {k: os.environ[k] for k in USER_ENV if k in os.environ}
        # no PREFECT_SERVER_ANALYTICS_ENABLED either: that telemetry is off is the product's job (flows/offline.py)
        self.env.update(PYTHONPATH=str(path), PREFECT_HOME=str(home / ".prefect"), HOME=str(home))
        self.tracked = set(tracked_files(path))
        self.owned: set[str] = set()

    def run(self, cmd: str | list[str], timeout: float = 900, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
        shell = isinstance(cmd, str)
        proc = subprocess.run(cmd, shell=shell, cwd=self.path, env={**self.env, **(env or {})}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{cmd}` exited {proc.returncode}:\n{proc.stdout[-6000:]}")
        return proc

    def own(self, rel: str) -> Path:
        """A folder of the user's own (raw data they put in the checkout): not a run's litter."""
        self.owned.add(rel.rstrip("/"))
        return self.path / rel

    def leftovers(self) -> list[str]:
        """Files in the checkout that are neither tracked nor under runs/ (what a user's run may write), nor
        Python's own caches: what a run littered the user's checkout with."""
        out = []
        for p in self.path.rglob("*"):
            rel = p.relative_to(self.path)
            if rel.parts[0] in (".venv", "runs", *self.owned) or "__pycache__" in rel.parts \
                    or not (p.is_file() or p.is_symlink()):
                continue
            if rel.as_posix() not in self.tracked:
                out.append(rel.as_posix())
        return sorted(out)

    def walk(self, lines: list[str], env: dict | None = None, timeout: float = 3000) -> list[tuple[str, str]]:
        """Run `lines` as written, in order, in one fresh bash (no profile, no rc; the user's environment only) that
        stops at the first failing line: [(line, its output)]. Setup is done (the .venv is the installed one): the
        copy's pyproject.toml and constraints.txt are dated before its stamp, so `make demo` does not reinstall."""
        import shlex

        stamp = self.path / ".venv" / ".setup-stamp"
        if stamp.exists():
            before = stamp.stat().st_mtime - 60
            for rel in ("pyproject.toml", "constraints.txt"):
                os.utime(self.path / rel, (before, before))
        mark = "@@walk@@ "
        script = "set -e -o pipefail\n" + "".join(f"echo {shlex.quote(mark + ln)}\n{ln}\n" for ln in lines)
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=self.path, text=True,
                              env={**self.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout)
        parts = proc.stdout.split(mark)[1:]
        done = [(p.split("\n", 1)[0], p.split("\n", 1)[1] if "\n" in p else "") for p in parts]
        if proc.returncode != 0:
            raise AssertionError(f"README line `{done[-1][0] if done else '?'}` exited {proc.returncode}:\n"
                                 f"{done[-1][1][-6000:] if done else proc.stdout[-6000:]}")
        assert [line for line, _ in done] == lines, "the walk stopped early"
        return done

    def make(self, target_cmd: str, **kw) -> subprocess.CompletedProcess:
        """A README `make X` command; setup is already done (the .venv is the installed one), so
        make is told not to remake its stamp (it would reinstall into the shared .venv)."""
        assert target_cmd.startswith("make "), target_cmd
        return self.run(target_cmd.replace("make ", "make -o .venv/.setup-stamp ", 1), **kw)


@pytest.fixture
def user_repo(tmp_path):
    if not (VENV / "bin" / "llm-pipeline").exists():
        machine_skip(f"no installed .venv at {VENV} (run `make setup`)")
    repo = tmp_path / "llm-pipeline"
    for rel in tracked_files(ROOT):
        dst = repo / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst)
    (repo / ".venv").symlink_to(VENV)
    user = UserRepo(repo, tmp_path)
    yield user
    assert user.leftovers() == [], "a user's run left files in the checkout outside runs/"
