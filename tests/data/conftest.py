"""Fixtures of the data-stage tests (helpers live in datagen.py; the S3 endpoint fixtures
s3_endpoint / s3_bucket come from tests/conftest.py)."""
from __future__ import annotations

import pytest
from datagen import make_cfg


@pytest.fixture
def tiny_cfg(tmp_path):
    return make_cfg(tmp_path)
