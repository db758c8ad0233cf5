"""Loaded by every Python process of the ask-lease test's worker (its PYTHONPATH starts here).

Two test-time settings, nothing else: (1) the stages are tests/flows/stage_doubles.py (as the in-process gate tests
route them), (2) time is compressed: the engine leases its deployment slot for 60 s (the API's minimum renewal) and
every lease is renewed at 1.25% of its duration instead of 75% (the engine's every 0.75 s, a `concurrency` block's
every 3.75 s), so a pause of seconds meets several renewals; unpatched, the first renewal after pausing came 94-171 s late."""
import dataclasses
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # tests/flows: stage_doubles

import prefect.concurrency._leases as _leases  # noqa: E402
import prefect.flow_engine as _engine  # noqa: E402

from pipeline_lib import stages as _stages  # noqa: E402

_leases._RENEWAL_FRACTION = 0.0125
_maintain = _engine.maintain_concurrency_lease


def _short_lease(lease_id, lease_duration, *args, **kwargs):
    return _maintain(lease_id, min(lease_duration, 60), *args, **kwargs)


_engine.maintain_concurrency_lease = _short_lease
for _name, _spec in list(_stages.SPECS.items()):
    _runner = "stage_doubles:pretrain_with_checkpoint" if _name == "pretrain" else f"stage_doubles:{_name}"
    _stages.SPECS[_name] = dataclasses.replace(_spec, runner=_runner)
