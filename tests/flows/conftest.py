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


@pytest.fixture
def night_on_raw(tiny_cfg, tmp_path, monkeypatch):
    """(config reading <tmp>/raw/*.jsonl, the raw folder) for nights whose pretrain double writes a checkpoint."""
    monkeypatch.setitem(stages.SPECS, "pretrain", dataclasses.replace(stages.SPECS["pretrain"],
                                                                      runner="stage_doubles:pretrain_with_checkpoint"))
    raw = tmp_path / "raw"
    raw.mkdir()
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.data.inputs = [str(raw / "*.jsonl")]
    return cfg, raw
