"""What changed between two runs: `llm-pipeline diff CONFIG --run-id A --run-id B` and every night's artifact.

`diff_runs(cfg, a, b)` reads both run folders under run.output_root (local or s3://, through the store) and
`RunDiff.markdown()` renders, as narrow tables that stay readable in a 1,600 px window, what decides first:
1. what decided night B: its candidate against the promoted model it was judged against, on the same rows (the
   gate's verdict from the nightly state, or passed by the night; else B's own evaluation of labels base and
   pretrained), both values, the change vs the promoted model, better / worse, the metrics against promotion first;
2. the settings that differ (each stage manifest's `settings`: pipeline_lib/run_settings.py);
then folded (details/summary):
3. data: per source file of each run the documents read / kept / excluded (rejected + filtered) / duplicated (exact +
   near) and the top reasons (the data stage's stats.json), then the totals side by side with the change;
4. the token mix: the training tokens of each file and its share of its run's, and the mix the stats name (`mix`);
5. every perplexity (held-out, each reference set) and task accuracy per checkpoint label, A's and B's models side
   by side with `B vs A` (evaluate/metrics.json; held-out perplexity is on each run's own held-out split, so it is
   named so: not the gate's figure; the reference sets and tasks are the same files);
6. the fixed prompts whose answers changed, per checkpoint label both runs evaluated: the prompt, then A's answer
   and B's answer one under the other (evaluate/<label>/generations.jsonl).
`terminal_text` (pipeline_lib/terminal_text.py) prints it on a terminal without markdown.
A run without a data or evaluate stage shows as such in its sections. Raises RunNotFound (a ValueError) naming the
run id, the folder and the fix when a run folder holds neither, RunUnreadable (one too) when a file of it is not
what the stage writes (not JSON, another shape, over storage.bounded's caps, a checkpoint `dir` that is no name: it
is joined into a path). Plain Python: no Prefect, no MindSpore.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .evaluate.report import md_quote, md_table
from .storage import LongLine, RunPaths, store_for
from .storage.bounded import MAX_JSON_BYTES, MAX_LIST_BYTES, InputTooLarge, bounded_lines, read_capped

TOP_REASONS = 3
STAGES = ("data", "pretrain", "sft", "evaluate", "export")  # the stage folders whose manifests hold settings
CANDIDATE, PROMOTED = "pretrained", "base"  # a night's evaluate labels (pipeline_lib/nightly/gate.py)


class RunNotFound(ValueError):
    """A run id with no data stats and no evaluation under run.output_root."""


class RunUnreadable(RunNotFound):
    """A file of the run folder that is not what its stage writes."""

    def __init__(self, uri: str, problem: str):
        super().__init__(f"{uri}: {problem}. Fix: diff runs whose folders the pipeline wrote (rerun the stage, or "
                         "give another --run-id)")


MAX_ANSWER_LINE = 1 << 20  # one generated answer per line: a longer line is no generation the evaluate stage wrote


@dataclass
class RunFacts:
    run_id: str
    uri: str
    stats: dict | None = None            # data/stats.json
    evaluation: dict | None = None       # evaluate/metrics.json
    answers: dict = field(default_factory=dict)  # label -> prompt id -> generation text
    settings: dict = field(default_factory=dict)  # stage -> its manifest's settings (None: not recorded)


def _read_json(store, uri: str, endpoint: str | None = None) -> dict | None:
    if not store.exists(uri):
        return None
    try:
        doc = json.loads(read_capped(uri, endpoint, field="--run-id", max_bytes=MAX_JSON_BYTES))
    except InputTooLarge as err:
        raise RunUnreadable(uri, err.problem) from None
    except (ValueError, RecursionError) as err:
        raise RunUnreadable(uri, f"not JSON ({type(err).__name__}: {str(err)[:200]})") from None
    if not isinstance(doc, dict):
        raise RunUnreadable(uri, f"a JSON {type(doc).__name__}, not the object its stage writes")
    return doc


def _answers(uri: str, endpoint: str | None) -> dict:
    out = {}
    try:
        for n, line in enumerate(bounded_lines(uri, endpoint, field="--run-id", max_line=MAX_ANSWER_LINE,
                                               max_bytes=MAX_LIST_BYTES), 1):
            if isinstance(line, LongLine) or not line.strip():
                continue
            r = json.loads(line)
            if not (isinstance(r, dict) and isinstance(r.get("prompt_id"), (str, int)) and isinstance(r.get("text"), str)):
                raise RunUnreadable(uri, f"line {n} is not a generation ({{prompt_id, text}})")
            out[r["prompt_id"]] = r["text"]
    except InputTooLarge as err:
        raise RunUnreadable(uri, err.problem) from None
    except (ValueError, RecursionError) as err:
        if isinstance(err, RunUnreadable):
            raise
        raise RunUnreadable(uri, f"not JSON lines ({type(err).__name__})") from None
    return out


def read_run(cfg, run_id: str) -> RunFacts:
    endpoint = cfg.run.s3_endpoint_url
    paths = RunPaths(cfg.run.output_root, run_id, endpoint)
    store = store_for(paths.run_uri, endpoint)
    facts = RunFacts(run_id, paths.run_uri, _read_json(store, f"{paths.stage_uri('data')}/stats.json", endpoint),
                     _read_json(store, f"{paths.stage_uri('evaluate')}/metrics.json", endpoint))
    if facts.stats is None and facts.evaluation is None:
        raise RunNotFound(f"--run-id {run_id}: {paths.run_uri} holds no data/stats.json and no evaluate/metrics.json; "
                          "give a run id whose data or evaluate stage finished (ls run.output_root, or "
                          "llm-pipeline status CONFIG --run-id ID)")
    for stage in STAGES:
        manifest = _read_json(store, f"{paths.stage_uri(stage)}/manifest.json", endpoint)
        if manifest is not None:
            found = manifest.get("settings")
            facts.settings[stage] = found if isinstance(found, dict) and found else None
    metrics = f"{paths.stage_uri('evaluate')}/metrics.json"
    checkpoints = (facts.evaluation or {}).get("checkpoints", [])
    if not isinstance(checkpoints, list):
        raise RunUnreadable(metrics, "its `checkpoints` is not a list")
    for ck in checkpoints:
        if not (isinstance(ck, dict) and isinstance(ck.get("label"), str)):
            raise RunUnreadable(metrics, "a checkpoint entry without a `label`")
        d = ck.get("dir")  # joined into a path below: one folder name, never `../..` or an absolute path
        if not (isinstance(d, str) and 0 < len(d) <= 255 and d not in (".", "..") and not set(d) & {"/", "\\", "\0"}):
            raise RunUnreadable(metrics, f"checkpoint {ck['label']!r} has a `dir` that is not a folder name ({d!r})")
        uri = f"{paths.stage_uri('evaluate')}/{ck['dir']}/generations.jsonl"
        if store.exists(uri):
            facts.answers[ck["label"]] = _answers(uri, endpoint)
    return facts


def night_verdict(cfg, run_id: str) -> dict | None:
    """The gate's verdict of a night in the nightly state's history (None: not a decided night, no state)."""
    try:
        from .nightly.state import load_state

        state = load_state(cfg)
    except Exception:  # noqa: BLE001 (no nightly state: the diff of two runs still answers)
        return None
    for entry in reversed(state.get("history") or []):
        if entry.get("run_id") == run_id and isinstance(entry.get("verdict"), dict):
            return entry["verdict"]
    return None


def diff_runs(cfg, run_a: str, run_b: str, verdict: dict | None = None) -> "RunDiff":
    """The diff of two runs, its tables tried once: a stats.json or metrics.json of another shape (a number where a
    table is, a list where a mapping is) is RunUnreadable naming both runs' folders, not a TypeError. `verdict`:
    the gate's of night B (Verdict.to_json); None reads it from the nightly state when B is a decided night."""
    diff = RunDiff(read_run(cfg, run_a), read_run(cfg, run_b), verdict or night_verdict(cfg, run_b))
    try:
        diff.markdown()
    except (TypeError, KeyError, AttributeError, ValueError, IndexError) as err:
        raise RunUnreadable(f"{diff.a.uri} or {diff.b.uri}", "data/stats.json or evaluate/metrics.json is not of "
                            f"the shape its stage writes ({type(err).__name__}: {str(err)[:200]})") from None
    return diff


def _fmt(value, digits: int = 4, missing: str = "–") -> str:
    if value is None:
        return missing
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _change(a, b, relative: bool) -> str:
    if a is None or b is None:
        return "–"
    if relative:
        return f"{b / a - 1:+.2%}" if a else "–"
    delta = b - a
    return f"{delta:+,}" if isinstance(delta, int) else f"{delta:+.3f}"


def _excluded(entry: dict) -> int:
    return int(entry.get("rejected_total", 0)) + int(entry.get("filtered_total", 0))


def _duplicated(entry: dict) -> int:
    return int(entry.get("exact_duplicates", 0)) + int(entry.get("near_duplicates", 0))


def top_reasons(entry: dict, n: int = TOP_REASONS) -> str:
    """The n commonest reasons a file's documents were not kept (rejected, filtered, duplicates), with counts."""
    counts = {**entry.get("rejected", {}), **entry.get("filtered", {})}
    for kind in ("exact_duplicates", "near_duplicates"):
        if entry.get(kind):
            counts[kind.replace("_", " ")] = entry[kind]
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return ", ".join(f"{reason} {count}" for reason, count in ranked) or "–"


def _file_name(name: str, entry: dict) -> str:
    return PurePosixPath(entry.get("uri") or name).name or name


def _checkpoint_metrics(ck: dict) -> dict[str, tuple[float | None, bool]]:
    """metric name -> (value, relative change?) of one evaluated checkpoint."""
    out = {"held-out perplexity": ((ck.get("perplexity") or {}).get("perplexity"), True)}
    for name, ref in (ck.get("reference") or {}).items():
        out[f"{name} perplexity"] = (ref.get("perplexity"), True)
    for name, task in (ck.get("tasks") or {}).items():
        out[f"{name} accuracy"] = (task.get("accuracy"), False)
    return out


def _lower_is_better(metric: str) -> bool:
    return not metric.endswith("accuracy")


def mark(metric: str, before, after) -> str:
    """better / worse / same for B against its baseline (perplexity: lower is better; accuracy: higher)."""
    if before is None or after is None:
        return "–"
    if after == before:
        return "same"
    return "better" if (after < before) == _lower_is_better(metric) else "worse"


@dataclass
class RunDiff:
    a: RunFacts
    b: RunFacts
    verdict: dict | None = None  # the gate's verdict of night B (its rows: promoted vs candidate, same rows)

    def gate_rows(self) -> list[dict]:
        """B's candidate against the promoted model it was judged against, on the same rows: the gate's verdict
        when there is one (the metrics that argued against promotion first), else B's own evaluation of the two
        (labels base / pretrained). Both values, the change vs the promoted model, better / worse."""
        if self.verdict and self.verdict.get("rows"):
            rows = sorted(self.verdict["rows"], key=lambda r: (bool(r.get("ok", True)), not r.get("informative", True)))
            return [{"metric": r["metric"], "promoted": _fmt(r.get("promoted")), "candidate": _fmt(r.get("candidate")),
                     "change vs the promoted": r.get("change_text") or _change(r.get("promoted"), r.get("candidate"),
                                                                               _lower_is_better(r["metric"])),
                     "budget": r.get("budget_text", "–"), "": mark(r["metric"], r.get("promoted"), r.get("candidate")),
                     "gate": r.get("outcome", "")} for r in rows]
        by = {ck["label"]: _checkpoint_metrics(ck) for ck in (self.b.evaluation or {}).get("checkpoints", [])}
        if CANDIDATE not in by or PROMOTED not in by:
            return []
        rows = []
        for metric, (after, rel) in by[CANDIDATE].items():
            before = by[PROMOTED].get(metric, (None, rel))[0]
            rows.append({"metric": metric, "promoted": _fmt(before), "candidate": _fmt(after),
                         "change vs the promoted": _change(before, after, relative=rel), "budget": "–",
                         "": mark(metric, before, after), "gate": "–"})
        return rows

    def setting_rows(self) -> list[dict]:
        from .run_settings import differing

        return [{"setting": r["setting"], self.a.run_id: r["a"], self.b.run_id: r["b"]}
                for r in differing(self.a.settings, self.b.settings)]

    def data_rows(self) -> list[dict]:
        rows = []
        for facts in (self.a, self.b):
            for name, entry in sorted(((facts.stats or {}).get("files") or {}).items()):
                rows.append({"run": facts.run_id, "file": _file_name(name, entry), "read": entry.get("read"),
                             "kept": entry.get("kept"), "excluded": _excluded(entry),
                             "duplicated": _duplicated(entry), "top reasons": top_reasons(entry)})
        return rows

    def total_rows(self) -> list[dict]:
        ta, tb = ((f.stats or {}).get("total") for f in (self.a, self.b))
        figures = [("files", lambda t, s: len(s.get("files") or {})), ("read", lambda t, s: t.get("read")),
                   ("kept", lambda t, s: t.get("kept")), ("excluded", lambda t, s: _excluded(t)),
                   ("duplicated", lambda t, s: _duplicated(t)), ("training tokens", lambda t, s: t.get("tokens_train")),
                   ("training rows", lambda t, s: t.get("rows_train")),
                   ("held-out tokens", lambda t, s: t.get("tokens_heldout"))]
        rows = []
        for name, get in figures:
            va = get(ta, self.a.stats) if ta is not None else None
            vb = get(tb, self.b.stats) if tb is not None else None
            rows.append({"": name, self.a.run_id: _fmt(va), self.b.run_id: _fmt(vb),
                         "change": _change(va, vb, relative=False)})
        return rows

    def mix_rows(self) -> list[dict]:
        rows = []
        for facts in (self.a, self.b):
            stats = facts.stats or {}
            total = (stats.get("total") or {}).get("tokens_train") or 0
            for name, entry in sorted((stats.get("files") or {}).items()):
                tokens = entry.get("tokens_train") or 0
                rows.append({"run": facts.run_id, "source": _file_name(name, entry), "training tokens": _fmt(tokens),
                             "share": f"{tokens / total:.1%}" if total else "–"})
            for name, value in sorted((stats.get("mix") or {}).items()):  # e.g. new vs replay, when the stats say
                if isinstance(value, (int, float)):
                    rows.append({"run": facts.run_id, "source": f"mix: {name}", "training tokens": _fmt(value),
                                 "share": f"{value / total:.1%}" if total and isinstance(value, int) else "–"})
        return rows

    def labels(self) -> list[str]:
        """Checkpoint labels of either run, B's order first."""
        out = []
        for facts in (self.b, self.a):
            for ck in (facts.evaluation or {}).get("checkpoints", []):
                if ck["label"] not in out:
                    out.append(ck["label"])
        return out

    def metric_rows(self) -> list[dict]:
        by = [{ck["label"]: _checkpoint_metrics(ck) for ck in (f.evaluation or {}).get("checkpoints", [])}
              for f in (self.a, self.b)]
        rows = []
        for label in self.labels():
            ma, mb = by[0].get(label, {}), by[1].get(label, {})
            for metric in list(mb) + [m for m in ma if m not in mb]:
                va, rel = ma.get(metric, (None, True))
                vb, rel_b = mb.get(metric, (None, rel))
                shown = "held-out perplexity (each run's own split)" if metric == "held-out perplexity" else metric
                rows.append({"checkpoint": label, "metric": shown, self.a.run_id: _fmt(va, missing="not scored"),
                             self.b.run_id: _fmt(vb, missing="not scored"),
                             "B vs A": _change(va, vb, relative=rel and rel_b), "": mark(metric, va, vb)})
        return rows

    def changed_answers(self) -> list[dict]:
        """One entry per (prompt, label) whose answer differs between the runs, in B's prompt order."""
        prompts = {p["id"]: p for f in (self.a, self.b) for p in (f.evaluation or {}).get("prompts", [])}
        order = [p["id"] for p in (self.b.evaluation or {}).get("prompts", [])] + \
            [p["id"] for p in (self.a.evaluation or {}).get("prompts", [])]
        out, seen = [], set()
        for pid in order:
            if pid in seen:
                continue
            seen.add(pid)
            for label in self.labels():
                before, after = self.a.answers.get(label, {}).get(pid), self.b.answers.get(label, {}).get(pid)
                if before is not None and after is not None and before != after:
                    out.append({"prompt_id": pid, "set": prompts[pid].get("set", ""), "prompt": prompts[pid]["prompt"],
                                "checkpoint": label, "a": before, "b": after})
        return out

    def unchanged_count(self) -> int:
        compared = sum(1 for label in self.labels() for pid in self.b.answers.get(label, {})
                       if pid in self.a.answers.get(label, {}))
        return compared - len(self.changed_answers())

    def markdown(self, title: str | None = None) -> str:
        """Deciding metrics first (the gate's comparison, then the settings that differ), the rest folded."""
        a, b = self.a.run_id, self.b.run_id
        parts = [f"# {title or f'What changed: {a} -> {b}'}\n",
                 f"A = `{a}` ({self.a.uri}), B = `{b}` ({self.b.uri}).\n"]
        gate = self.gate_rows()
        if gate:
            decided = f" (the gate: {self.verdict.get('outcome')})" if self.verdict else ""
            parts += [f"## What decided B{decided}: B's candidate vs the promoted model\n",
                      "The gate's comparison, on the same rows and items in B's evaluate run: `promoted` is the model "
                      "B was judged against (the promoted night's), `candidate` B's. Change vs the promoted model; "
                      "perplexity lower is better, accuracy higher. The metrics that argued against promotion first.\n",
                      md_table(gate)]
        settings = self.setting_rows()
        parts += ["## Settings that differ\n",
                  md_table(settings) if settings else "_None: every stage both runs ran had the same settings._\n"]
        data = []
        if self.a.stats is None or self.b.stats is None:
            missing = [f.run_id for f in (self.a, self.b) if f.stats is None]
            data.append(f"_No data stage stats for {', '.join(missing)}._\n")
        data += ["Documents per source file (excluded = rejected + filtered, duplicated = exact + near; "
                 "the top reasons any document was not kept):\n", md_table(self.data_rows()),
                 "Totals (change: B minus A):\n", md_table(self.total_rows())]
        parts.append(_fold("Data: documents per source file and totals", data))
        parts.append(_fold("Token mix", [md_table(self.mix_rows())]))
        parts.append(_fold(
            "Every perplexity and task accuracy: B's models vs A's (B vs A)",
            ["Each run's own evaluation, label by label: `B vs A` is relative for perplexity (B / A - 1), absolute for "
             "accuracy. Held-out perplexity is on each run's own held-out split (different rows: not the gate's "
             "figure); reference sets and tasks are the same files for both.\n",
             md_table(self.metric_rows()) if self.labels() else "_Neither run has an evaluation._\n"]))
        changed = self.changed_answers()
        answers = [f"{len(changed)} answer(s) changed, {self.unchanged_count()} the same "
                   "(fixed prompts, per checkpoint label both runs evaluated).\n"]
        last = None
        for c in changed:
            if c["prompt_id"] != last:
                answers.append(f"### {c['prompt_id']} ({c['set']})\n\n{md_quote(c['prompt'])}\n")
                last = c["prompt_id"]
            answers.append(f"**{c['checkpoint']}, A** ({a})\n\n{md_quote(c['a'])}\n\n"
                           f"**{c['checkpoint']}, B** ({b})\n\n{md_quote(c['b'])}\n")
        parts.append(_fold(f"Answers that changed ({len(changed)})", answers))
        return "\n".join(parts)


def _fold(summary: str, body: list[str]) -> str:
    """A folded section (the Prefect UI renders details/summary; a terminal prints it as a heading)."""
    return "\n".join([f"<details><summary>{summary}</summary>\n", *body, "</details>\n"])
