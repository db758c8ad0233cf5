import dataclasses, json
import pytest
from flows.nightly import nightly
from pipeline_lib import stages
from test_error_logs import logs_by_flow_run

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server", "stage_doubles")]

def test_scratch(night_on_raw, monkeypatch):
    cfg, raw = night_on_raw
    (raw / "a.jsonl").write_text(json.dumps({"text": "news"}) + "\n")
    monkeypatch.setitem(stages.SPECS, "pretrain", dataclasses.replace(stages.SPECS["pretrain"], runner="error_double:pretrain"))
    st = nightly(config=cfg.model_dump(mode="json"), run_date="2026-12-01", return_state=True)
    print("STATE", st.name, st.message[:300])
    for name, recs in logs_by_flow_run("2026-12-01").items():
        print("=====", name)
        for r in recs:
            if r.level >= 30: print(r.level, r.name, repr(r.message[:300]))
