"""Fixtures of the doctor tests."""
from __future__ import annotations

import pytest

from pipeline_lib.config import config_from_dict

from doctor_cases import LLAMA2_7B_DP4


@pytest.fixture
def oom_cfg():
    return config_from_dict(LLAMA2_7B_DP4)
