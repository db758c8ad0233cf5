import dataclasses

import pytest

from pipeline_lib import stages


@pytest.fixture
def stage_doubles(monkeypatch):
    """Route every stage to tests/flows/stage_doubles.py (importable: pytest puts this folder on sys.path)."""
    for name, spec in list(stages.SPECS.items()):
        monkeypatch.setitem(stages.SPECS, name, dataclasses.replace(spec, runner=f"stage_doubles:{name}"))
    yield


@pytest.fixture
def tiny_cfg(tmp_path):
    from pipeline_lib.config import load_config

    return load_config("configs/pipelines/tiny-cpu.yaml",
                       [f"run.output_root={tmp_path / 'runs'}", "orchestration.retry_delay_seconds=0.1",
                       "data.executor=local"])
