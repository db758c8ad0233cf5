"""data.filters checked by the data stage's own builder, before anything runs. Raises nothing."""
from __future__ import annotations

from ..config.errors import ConfigIssue
from ..config.schema import PipelineConfig
from ..data.errors import DataStageError
from ..data.filters import build_filters


def filter_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    """data.filters built the way the data stage builds them: the first one it refuses, as a ConfigIssue."""
    try:
        build_filters(cfg.data.filters)
    except DataStageError as err:
        return [ConfigIssue(err.field, err.value, err.problem, err.fix)]
    return []
