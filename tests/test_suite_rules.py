"""The suite's own rule for unmarked slow tests: 10 s on an idle machine, scaled by the load per core beyond it."""
import os

import suite_rules


def test_the_slow_limit_is_ten_seconds_until_the_machine_is_busier_than_its_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 0.0, 0.0))
    assert suite_rules.slow_limit() == suite_rules.SLOW_SECONDS == 10.0
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 0.0, 0.0))
    assert suite_rules.slow_limit() == 30.0
