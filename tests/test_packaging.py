"""`make setup`'s editable install (`pip install -e .`) prints no setuptools notice: the flat layout is declared
(pyproject.toml [tool.setuptools] package-dir), so setuptools writes a plain .pth file instead of a meta path finder
with its 10-line "Editable installation ... same name as your package" BuildBackendWarning."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = """
import sys, warnings
warnings.simplefilter("always")
from setuptools import build_meta
print("WHEEL", build_meta.build_editable(sys.argv[1]))
"""


def test_the_editable_install_is_a_plain_pth_file_and_says_nothing(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, project / name)
    for package in ("pipeline_lib", "tasks", "flows", "deployments"):
        shutil.copytree(ROOT / package, project / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / "dist")], cwd=project, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "Editable installation" not in said and "same name as your package" not in said, said[-3000:]
    wheel = tmp_path / "dist" / out.stdout.split("WHEEL ")[-1].strip()
    with zipfile.ZipFile(wheel) as whl:
        pth = [n for n in whl.namelist() if n.endswith(".pth")]
        assert pth and whl.read(pth[0]).decode().strip() == str(project.resolve())
        assert not [n for n in whl.namelist() if "finder" in n]
