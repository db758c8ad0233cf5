"""The lineage view (pipeline_lib/nightly/lineage.py) and the decide form's list of held nights
(flows/night_lineage.py decide_schema), on constructed states."""
from flows.night_lineage import decide_schema
from pipeline_lib.nightly.lineage import DECISIONS_SHOWN, end_name, end_tags, held_why, lineage_markdown

HELD = {"run_id": "nightly-2026-12-05", "finished_at": "2026-12-05T03:10:00+00:00",
        "verdict": {"reason": "over budget", "rows": [
            {"metric": "held-out perplexity", "change_text": "+30.0%", "outcome": "regressed"},
            {"metric": "general_zh perplexity", "change_text": "+1.0%", "outcome": "within"}]}}


def test_the_lineage_names_the_live_night_the_held_ones_and_the_newest_decisions_first():
    history = [{"run_id": f"nightly-2026-11-{d:02d}", "decision": "promoted"} for d in range(1, 13)]
    history.append({"run_id": "nightly-2026-12-05", "decision": "held", "verdict": HELD["verdict"]})
    state = {"latest": {"run_id": "nightly-2026-11-12", "finished_at": "2026-11-12T03:00:00+00:00",
                        "checkpoint": "/r/nightly-2026-11-12/ck.ckpt"}, "held": [HELD], "history": history}
    text = lineage_markdown(state, "decide here")
    assert text.startswith("# Live night: `nightly-2026-11-12`\n")
    assert "promoted by the gate, finished 2026-11-12 03:00:00 UTC" in text
    assert "| `nightly-2026-12-05` | 2026-12-05 03:10:00 UTC | held-out perplexity +30.0% |" in text
    assert "general_zh" not in text.split("## Last")[0]  # only what held it
    decisions = [line for line in text.split("## Last decisions", 1)[1].splitlines() if line.startswith("| `")]
    assert len(decisions) == DECISIONS_SHOWN
    assert decisions[0].startswith("| `nightly-2026-12-05` | held | the gate | held-out perplexity +30.0%")
    assert decisions[1].startswith("| `nightly-2026-11-12` | promoted")


def test_a_lineage_without_a_live_night_or_held_ones_says_so():
    text = lineage_markdown({"history": [], "held": []}, "decide here")
    assert "No night is live yet" in text and "none waiting for a decision" in text and "decide here" not in text


def test_held_why_falls_back_to_the_gates_reason():
    assert held_why({"verdict": {"reason": "no answer", "rows": []}}) == "no answer"
    assert held_why(HELD) == "held-out perplexity +30.0%"


def test_end_tags_set_held_apart_from_promoted():
    assert "HELD" in end_tags("Held") and "decide" in end_tags("Held")
    assert not set(end_tags("Held")) & set(end_tags("Promoted"))
    assert end_tags("Skipped") == [] and end_tags("Busy") == []


def test_the_decide_form_lists_the_held_nights_or_says_none_is_held():
    schema = {"properties": {"run_id": {"title": "run_id", "type": "string", "position": 1}, "who": {}},
              "required": ["run_id"]}
    listed = decide_schema(schema, ["nightly-2026-12-02", "nightly-2026-12-03"])
    assert listed["properties"]["run_id"]["enum"] == ["nightly-2026-12-02", "nightly-2026-12-03"]
    assert listed["properties"]["run_id"]["position"] == 1 and listed["properties"]["who"] == {}
    none = decide_schema(listed, [])
    assert "enum" not in none["properties"]["run_id"] and "no night is held now" in none["properties"]["run_id"]["description"]


def test_a_night_that_asks_for_a_person_says_so_in_its_name_once():
    assert end_name("nightly/2026-12-05", "Held") == "nightly/2026-12-05 · HELD, decide"
    assert end_name("nightly/2026-12-05 · HELD, decide", "Held") == "nightly/2026-12-05 · HELD, decide"  # a retry
    assert end_name("nightly/2026-12-05", "Promoted") == "nightly/2026-12-05"
    assert end_name("nightly/2026-12-05", "Quarantined").endswith(" · QUARANTINED")
