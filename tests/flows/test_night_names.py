"""flows/night_names.py: the names of upcoming and running nights (their date in the schedule's zone, -2 for a
second run of a date); the server side is in tests/deployments/test_deployments.py and test_nightly_gate.py."""
import datetime as dt

from flows.night_names import night_name, scheduled_names

UTC = dt.timezone.utc


def test_upcoming_runs_are_named_by_their_date_in_the_schedules_zone_and_a_second_of_a_date_gets_a_suffix():
    starts = [("c", dt.datetime(2026, 12, 5, 18, 0, tzinfo=UTC)),   # 02:00 Dec 6 in Shanghai
              ("a", dt.datetime(2026, 12, 4, 18, 0, tzinfo=UTC)),   # 02:00 Dec 5
              ("b", dt.datetime(2026, 12, 5, 6, 0, tzinfo=UTC))]    # 14:00 Dec 5: a second run of that date
    assert scheduled_names(starts, "Asia/Shanghai") == {"a": "nightly/2026-12-05", "b": "nightly/2026-12-05-2",
                                                        "c": "nightly/2026-12-06"}
    assert scheduled_names(starts, "UTC") == {"a": "nightly/2026-12-04", "b": "nightly/2026-12-05",
                                              "c": "nightly/2026-12-05-2"}


def test_a_running_night_is_named_by_its_run_id():
    assert night_name("nightly-2026-12-04") == "nightly/2026-12-04"
    assert night_name("nightly-2026-12-04-3") == "nightly/2026-12-04-3"
