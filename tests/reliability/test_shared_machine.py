"""A shared machine (issue 45, item 1): another local account against the local work folders of s3:// runs.

The data stage's local copy and the trainer's folder had fixed names under the temp dir (`llm-pipeline-data`,
`llm-pipeline-work/<sha of the uri>`), used through links: an account that made the folder first received the
whole cleaned corpus of an s3:// run, a dangling link failed the run (`FileExistsError`), and a failed run's copy
was world-readable. Here a second real account (`nobody`, run as it through setuid: the tests need root, else they
are skipped) prepares the shared temp dir the way an attacker would, then this process (the victim) opens its work
folders through the product's own entry points (data.workspace.Workspace, train.session.work_dir): each case must
end in a clear error naming the folder and the fix (PermissionError), never in a folder the other account can
read or steer; a folder made fresh is private (0700, ours), and what a run writes there cannot be read by the
other account. Counted in the `shared` row of bench/reliability.py.
"""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.data.workspace import Workspace
from pipeline_lib.storage import RunPaths
from pipeline_lib.train.session import work_dir

RELIABILITY_ROW = "shared"
STAGE_URI = "s3://bucket/runs/r1/pretrain"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second local account needs root (setuid)")


def _other() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no second local account (`nobody`) on this machine")


def as_other(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run python `code` (standard library only) as the other account (its uid and gid, no supplementary groups),
    with the system's interpreter: ours may sit under a folder only root enters (pyenv under /root)."""
    who = _other()
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the second account to run")
    return subprocess.run([python, "-I", "-c", code, *args], user=who.pw_uid, group=who.pw_gid,
                          extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def shared_tmp(monkeypatch):
    """A temp dir as /tmp is (1777: everyone creates, nobody removes another's), used as the product's temp dir."""
    folder = Path(tempfile.mkdtemp(prefix="shared-tmp-", dir="/tmp"))
    folder.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.delenv("LLM_PIPELINE_WORK_DIR", raising=False)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _data_workspace() -> Workspace:
    cfg = config_from_dict({"run": {"output_root": "s3://bucket/runs"}})
    return Workspace(cfg, RunPaths(cfg.run.output_root, "r1"), shared=False)


def _opens(*kinds: str):
    """The product's entry points that open a local work folder of an s3:// run."""
    for kind in kinds:
        yield kind, (_data_workspace if kind == "data" else lambda: work_dir(STAGE_URI, create=True))


PLANTS = {  # what the other account makes at the name the victim will use, first
    "a folder open to all": "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)",
    "a private folder of its own": "import os, sys; os.mkdir(sys.argv[1], 0o700)",
    "a dangling link": "import os, sys; os.symlink(sys.argv[1] + '-target', sys.argv[1])",
    "a link to its folder": "import os, sys; os.mkdir(sys.argv[1] + '-target'); os.chmod(sys.argv[1] + '-target', "
                            "0o777); os.symlink(sys.argv[1] + '-target', sys.argv[1])",
    "a file": "import sys; open(sys.argv[1], 'w').write('x')",
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_work_root_made_first_by_another_account_is_refused_clearly_and_never_used(shared_tmp, plant, tally):
    root = shared_tmp / f"llm-pipeline-{os.geteuid()}"
    made = as_other(PLANTS[plant], str(root))
    assert made.returncode == 0, made.stderr
    refused = 0
    for kind, open_folder in _opens("data", "train"):
        with pytest.raises(PermissionError) as caught:
            open_folder()
        text = str(caught.value)
        assert str(root) in text and "Fix:" in text and "LLM_PIPELINE_WORK_DIR" in text, (kind, text)
        refused += 1
    # nothing of the victim's was made there, nor where a link pointed
    for place in (root, Path(f"{root}-target")):
        if place.is_dir() and not place.is_symlink():
            assert list(place.iterdir()) == [], (plant, list(place.iterdir()))
    assert not Path(f"{root}-target").exists() or plant == "a link to its folder"
    tally.add(RELIABILITY_ROW, cases=2, refused_clearly=refused)


def test_a_folder_planted_under_a_chosen_shared_work_dir_is_refused(shared_tmp, monkeypatch, tally):
    """$LLM_PIPELINE_WORK_DIR at a shared folder (a scratch disk all accounts write): every level under it is
    checked, so the other account's folder at the training folder's name is not trained in, cleared or resumed."""
    monkeypatch.setenv("LLM_PIPELINE_WORK_DIR", str(shared_tmp))
    target = work_dir(STAGE_URI)  # learn the name (not created when only looked up), then give it away
    assert not target.exists()
    made = as_other("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777); "
                    "open(os.path.join(sys.argv[1], 'latest_checkpoint.json'), 'w').write('{}')", str(target))
    assert made.returncode == 0, made.stderr
    for create in (True, False):  # the stage that trains there, and a look at a running stage's files
        with pytest.raises(PermissionError, match=f"{target} belongs to nobody"):
            work_dir(STAGE_URI, create=create)
    tally.add(RELIABILITY_ROW, cases=1, refused_clearly=1)


def test_an_own_folder_others_may_write_is_refused_and_one_they_may_read_is_made_private(shared_tmp, tally):
    root = shared_tmp / f"llm-pipeline-{os.geteuid()}"
    root.mkdir()
    root.chmod(0o777)  # anyone may have put files in it
    with pytest.raises(PermissionError, match="has mode 0777: other accounts may write into it.*chmod 700"):
        _data_workspace()
    root.chmod(0o755)  # what an earlier version's umask made: ours, readable by others
    ws = _data_workspace()
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700 and ws.root.is_relative_to(root)
    read = as_other("import os, sys; print(os.listdir(sys.argv[1]))", str(root))
    assert read.returncode != 0 and "PermissionError" in read.stderr
    tally.add(RELIABILITY_ROW, cases=2, refused_clearly=1, private=1)


def test_fresh_work_folders_are_private_and_a_failed_runs_copy_is_unreadable_to_others(shared_tmp, tally):
    ws = _data_workspace()
    part = ws.local("cleaned/part-00000.jsonl.gz")  # what a data stage writes before it uploads (or fails)
    part.write_text('{"text": "a cleaned document"}\n')
    part.chmod(0o644)
    read = as_other("import sys; print(open(sys.argv[1]).read())", str(part))
    assert read.returncode != 0 and "PermissionError" in read.stderr and "cleaned document" not in read.stdout
    out = work_dir(STAGE_URI, create=True)
    for leaf in (ws.root, out):  # every level from the shared temp dir down: a folder of ours, 0700, no link
        for folder in [leaf, *leaf.parents][:len(leaf.relative_to(shared_tmp).parts)]:
            st = os.lstat(folder)
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700, \
                (folder, oct(st.st_mode))
    assert ws.root == _data_workspace().root and out == work_dir(STAGE_URI, create=True)  # stable: a rerun resumes there
    listed = as_other("import os, sys; print(os.listdir(sys.argv[1]))", str(ws.root.parent))
    assert listed.returncode != 0 and "PermissionError" in listed.stderr
    tally.add(RELIABILITY_ROW, cases=2, private=2)
