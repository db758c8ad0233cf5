"""Table artifacts a person reads: rounded floats, everything else as it is."""
import math

from tasks.artifacts import readable_row


def test_floats_are_rounded_for_the_ui_table():
    row = readable_row({"step": 12, "loss": 3.7412345678, "lr": 0.000123456789, "ok": True, "name": "x",
                        "nan": float("nan"), "inf": float("inf")})
    assert row["loss"] == 3.741 and row["lr"] == 0.0001235 and row["step"] == 12 and row["ok"] is True
    assert math.isnan(row["nan"]) and row["inf"] == float("inf") and row["name"] == "x"
