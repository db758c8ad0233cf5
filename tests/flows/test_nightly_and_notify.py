"""Nightly continued pretraining bookkeeping and the failure webhook, on a real Prefect server."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from flows.nightly import nightly
from flows.pipeline import llm_pipeline
from pipeline_lib.nightly import load_state

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server", "stage_doubles")]


def night_cfg(tiny_cfg, raw: Path):
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.data.inputs = [str(raw / "*.jsonl")]
    return cfg.model_dump(mode="json")


def test_nightly_takes_only_new_files_and_moves_latest_on_success(tiny_cfg, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "day1.jsonl").write_text('{"text": "a"}\n')
    config = night_cfg(tiny_cfg, raw)

    first = nightly(config=config, run_date="2026-11-28", return_state=True)
    assert first.is_completed(), first.message
    state = load_state(tiny_cfg)
    assert list(state["consumed"]) == [str(raw / "day1.jsonl")]
    assert state["latest"]["run_id"] == "nightly-2026-11-28"

    nothing = nightly(config=config, run_date="2026-11-29", return_state=True)
    assert nothing.name == "Skipped"
    after = load_state(tiny_cfg)  # nothing consumed, the pointer unchanged
    assert after["consumed"] == state["consumed"] and after["latest"] == state["latest"]

    (raw / "day2.jsonl").write_text('{"text": "b"}\n')
    run_dir = Path(tiny_cfg.run.output_root) / "nightly-2026-11-30"
    run_dir.mkdir(parents=True)
    (run_dir / "fail-pretrain").write_text("ValueError 1")
    failed = nightly(config=config, run_date="2026-11-30", return_state=True)
    assert failed.is_failed()
    after_fail = load_state(tiny_cfg)
    assert after_fail["latest"]["run_id"] == "nightly-2026-11-28"  # pointer did not move
    assert str(raw / "day2.jsonl") not in after_fail["consumed"]  # tomorrow picks it up again

    retry = nightly(config=config, run_date="2026-11-30", return_state=True)
    assert retry.is_completed(), retry.message
    final = load_state(tiny_cfg)
    assert final["latest"]["run_id"] == "nightly-2026-11-30"
    assert sorted(final["consumed"]) == [str(raw / "day1.jsonl"), str(raw / "day2.jsonl")]
    # The second night trained on the new file only.
    data_out = json.loads((run_dir / "data" / "out.json").read_text())
    assert data_out["stage"] == "data"


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_failure_webhook_posts_run_stage_and_error(tiny_cfg):
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = tiny_cfg.model_copy(deep=True)
        cfg.orchestration.failure_webhook_url = f"http://127.0.0.1:{server.server_port}/hook"
        run_dir = Path(cfg.run.output_root) / "r-hook"
        run_dir.mkdir(parents=True)
        (run_dir / "fail-pretrain").write_text("ValueError 1")
        state = llm_pipeline(config=cfg.model_dump(mode="json"), run_id="r-hook", stages=["data", "pretrain"],
                             return_state=True)
        assert state.is_failed()
    finally:
        server.shutdown()
    assert len(_Hook.received) == 1
    note = _Hook.received[0]
    assert note["run_id"] == "r-hook" and note["stage"] == "pretrain" and note["state"] == "FAILED"
    assert "planned ValueError" in note["error"]


def test_webhook_is_off_by_default(tiny_cfg):
    _Hook.received.clear()
    run_dir = Path(tiny_cfg.run.output_root) / "r-nohook"
    run_dir.mkdir(parents=True)
    (run_dir / "fail-data").write_text("ValueError 1")
    assert llm_pipeline(config=tiny_cfg.model_dump(mode="json"), run_id="r-nohook", stages=["data"],
                        return_state=True).is_failed()
    assert _Hook.received == []


def _texts(lines: list[bytes]) -> list[str]:
    """The text of every well-formed record (the tiny corpus holds broken ones on purpose)."""
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            out.append(record["text"])
    return out


def _red_runs(flow_run_id) -> list[str]:
    """The flow and task runs of a night (its chain, its stages, their steps) that ended Failed or Crashed (the night
    by its flow run: other tests on the session's server name nights of the same date alike)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        night = [client.read_flow_run(flow_run_id)]
        family, todo = list(night), list(night)
        while todo:  # the subflows, level by level (the chain under the night, the stages under the chain)
            found = []
            for parent in todo:
                tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [parent.id]}))
                child = {t.id: t.state.state_details.child_flow_run_id for t in tasks if t.state}
                found += [client.read_flow_run(child[t.id]) for t in tasks if child.get(t.id)]
                family += [t for t in tasks if not child.get(t.id)]
            todo = found
            family += found
    assert len(night) == 1 and len(family) > 3, [r.name for r in family]
    return [f"{r.name}: {r.state.name}" for r in family if r.state and r.state.type.value in ("FAILED", "CRASHED")]


@pytest.fixture
def real_data_stage(monkeypatch):
    """The real data stage, doubles for the training and evaluation stages (fast, still real files)."""
    import dataclasses

    from pipeline_lib import stages

    monkeypatch.setitem(stages.SPECS, "data", dataclasses.replace(
        stages.SPECS["data"], runner="pipeline_lib.data.stage:run_data_stage"))  # stage_doubles ran first
    monkeypatch.setitem(stages.SPECS, "pretrain", dataclasses.replace(  # a checkpoint: the gate compares
        stages.SPECS["pretrain"], runner="stage_doubles:pretrain_with_tokenizer"))
    yield


def test_nights_new_data_duplicates_held_carried_then_nothing(tiny_cfg, tmp_path, real_data_stage):
    """A manual data run of night 1's file first; night 1 trains all the same; night 2's new file holds only night
    1's documents: NoNewData, the watermark moves past it, nothing is trained, the webhook hears it; night 3 is
    held: its documents stay out of the dedup index, so night 4 trains its file again (not "seen before") with its
    own and is promoted: then they are in the index; night 5 has no new file: Skipped; then a night whose only new
    file is empty: NoUsableData, saying so."""
    from pipeline_lib.data.dedup_index import list_segments
    from pipeline_lib.nightly.documents import night_index_cfg

    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.received.clear()
    raw = tmp_path / "raw"
    raw.mkdir()
    corpus = (Path(__file__).resolve().parents[2] / "configs" / "data" / "tiny_corpus.jsonl").read_bytes()
    lines = corpus.splitlines()
    (raw / "day1.jsonl").write_bytes(b"\n".join(lines[:300]) + b"\n")
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.data.inputs, cfg.data.num_workers = [str(raw / "*.jsonl")], 1
    cfg.orchestration.failure_webhook_url = f"http://127.0.0.1:{server.server_port}/hook"
    config = cfg.model_dump(mode="json")
    # a manual run of the same config over the same file first (what `make demo` does): it extends the run's own
    # dedup lineage, not the nightly's, so night 1 still trains
    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths

    manual = cfg.model_copy(deep=True)
    manual.data.inputs = [str(raw / "day1.jsonl")]
    run_stage(manual, RunPaths(manual.run.output_root, "manual"), "data", workers=1)
    assert [m["run_id"] for m in list_segments(manual)] == ["manual"]
    try:
        first = nightly(config=config, run_date="2026-12-01", return_state=True)
        assert first.is_completed() and first.name == "Promoted", first.message
        runs = Path(tiny_cfg.run.output_root)
        assert (runs / "nightly-2026-12-01" / "pretrain" / "out.json").exists()

        (raw / "day2.jsonl").write_bytes(b"\n".join(corpus.splitlines()[:100]) + b"\n")  # seen on night 1
        second = nightly(config=config, run_date="2026-12-02", return_state=True)
        assert second.is_completed() and second.name == "NoNewData", second.message
        assert "no new data" in second.message and "nightly-2026-12-01" in second.message
        state = load_state(tiny_cfg)
        assert str(raw / "day2.jsonl") in state["consumed"]  # consumed: not retried every night
        assert state["latest"]["run_id"] == "nightly-2026-12-01"  # nothing trained, pointer unchanged
        assert not (runs / "nightly-2026-12-02" / "pretrain").exists()
        assert [n["name"] for n in _Hook.received] == ["NoNewData"]
        assert second.state_details.flow_run_id is not None
        assert _red_runs(second.state_details.flow_run_id) == []  # issue 48 item 6: an outcome, not a failure in the dashboard
        assert _Hook.received[0]["counts"]["duplicates_of_earlier_runs"] > 0

        def indexed() -> list[str]:
            return [m["run_id"] for m in list_segments(night_index_cfg(cfg))]

        (raw / "day3.jsonl").write_bytes(b"\n".join(lines[300:]) + b"\n")
        (runs / "gate-plan").write_text("1.3")  # the candidate's perplexities +30%: held
        third = nightly(config=config, run_date="2026-12-03", return_state=True)
        assert third.name == "Held", third.message
        day3 = str(raw / "day3.jsonl")
        kept = load_state(tiny_cfg)["ledger"][day3]["documents"]["kept"]
        assert kept > 100 and indexed() == ["nightly-2026-12-01"]  # the held night's segment is not published

        reversed_docs = [json.dumps({"text": text[::-1]}, ensure_ascii=False).encode() for text in _texts(lines[:60])]
        (raw / "day4.jsonl").write_bytes(b"\n".join(reversed_docs) + b"\n")
        (runs / "gate-plan").write_text("1.0")
        fourth = nightly(config=config, run_date="2026-12-04", return_state=True)
        assert fourth.name == "Promoted", fourth.message
        state = load_state(tiny_cfg)
        entry = state["ledger"][day3]
        assert (entry["status"], entry["into"], entry["documents"]["kept"]) == ("trained", "nightly-2026-12-04", kept)
        assert indexed() == ["nightly-2026-12-01", "nightly-2026-12-04"]  # in the index once promoted

        (raw / "day5.jsonl").write_bytes((raw / "day3.jsonl").read_bytes())  # night 3's documents again: seen now
        fifth = nightly(config=config, run_date="2026-12-05", return_state=True)
        assert fifth.name == "NoNewData", fifth.message
        assert "nightly-2026-12-04" in fifth.message

        last = nightly(config=config, run_date="2026-12-06", return_state=True)
        assert last.is_completed() and last.name == "Skipped", last.message

        (raw / "day7.jsonl").write_bytes(b"")  # an empty file says so, not "all rejected or filtered ()"
        empty = nightly(config=config, run_date="2026-12-07", return_state=True)
        assert empty.is_completed() and empty.name == "NoUsableData", empty.message
        assert "1 new file(s) of 0 bytes in all hold no record" in empty.message and "()" not in empty.message
        state = load_state(tiny_cfg)
        assert state["ledger"][str(raw / "day7.jsonl")]["status"] == "unusable"
        assert str(raw / "day7.jsonl") in state["consumed"] and state["latest"]["run_id"] == "nightly-2026-12-04"

        from pipeline_lib.nightly import promote_held

        promote_held(tiny_cfg, "nightly-2026-12-03", who="carol", reason="fine after all")  # by hand: indexed too
        assert indexed() == ["nightly-2026-12-01", "nightly-2026-12-03", "nightly-2026-12-04"]
        assert load_state(tiny_cfg)["ledger"][day3]["into"] == "nightly-2026-12-04"  # it reached a model already
    finally:
        server.shutdown()


def test_an_unreachable_webhook_is_logged_without_its_token(capsys):
    from flows.notify import _post

    _post("http://127.0.0.1:9/hook/T0KEN-secret?key=abc", {"x": 1})  # port 9 (discard): refused
    out = capsys.readouterr().out
    assert "not reached" in out and "T0KEN" not in out and "key=abc" not in out
