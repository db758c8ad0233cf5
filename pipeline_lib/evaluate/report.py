"""Side-by-side report of several checkpoints: table rows (for a Prefect table artifact), markdown, HTML.

Input: the evaluation summary (stage metrics.json: prompts and per-checkpoint results) and the
generations (label -> prompt id -> generations.jsonl record). Output:
- `summary_rows`: one row per checkpoint (perplexity, task accuracy, keyword hits, tokens, speed);
- `task_rows`: the accuracy table, one row per task of evaluate.tasks and a column per checkpoint;
- `comparison_rows`: one row per prompt with one answer column per checkpoint, in the order the
  checkpoints were given (base, pretrained, SFT, last night's, ...), plus keyword hits per checkpoint;
- `render_markdown` / `render_html`: the reading view: perplexity per checkpoint on top, then per
  prompt the answers of every checkpoint stacked (a page as wide as a screen whatever the number of
  checkpoints; HTML is self-contained, keywords found in an answer are highlighted).
Pure Python, no Prefect import: the orchestration layer renders the rows as an artifact.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path


def load_generations(stage_dir: str | Path, summary: dict) -> dict[str, dict[str, dict]]:
    """label -> prompt id -> record, from <stage_dir>/<dir>/generations.jsonl."""
    out: dict[str, dict[str, dict]] = {}
    for ck in summary["checkpoints"]:
        path = Path(stage_dir) / ck["dir"] / "generations.jsonl"
        recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        out[ck["label"]] = {r["prompt_id"]: r for r in recs}
    return out


def _ppl(ck: dict) -> float | None:
    p = ck.get("perplexity")
    return round(p["perplexity"], 3) if p else None


def _source(ref: dict) -> str:
    return ref.get("ckpt", "") + (f" + {ref['adapter']}" if ref.get("adapter") else "")


def _hits(ck: dict) -> str:
    return f"{ck.get('keyword_hits', 0)}/{ck.get('keywords_total', 0)}"


def summary_rows(summary: dict) -> list[dict]:
    """One row per checkpoint."""
    rows = []
    for ck in summary["checkpoints"]:
        rows.append({"checkpoint": ck["label"], "perplexity": _ppl(ck),
                     "heldout_tokens": (ck.get("perplexity") or {}).get("tokens"),
                     "reference": {name: r["perplexity"] for name, r in (ck.get("reference") or {}).items()},
                     "tasks": {name: t["accuracy"] for name, t in (ck.get("tasks") or {}).items()},
                     "task_items": {name: t.get("items") for name, t in (ck.get("tasks") or {}).items()},
                     "task_chance": {name: t.get("chance") for name, t in (ck.get("tasks") or {}).items()},
                     "keyword_hits": _hits(ck), "generated_tokens": ck.get("generated_tokens"),
                     "tokens_per_s": ck.get("tokens_per_second"), "lora_merged": bool(ck.get("lora_merged")),
                     "source": _source(ck["ref"])})
    return rows


def comparison_rows(summary: dict, generations: dict[str, dict[str, dict]]) -> list[dict]:
    """One row per prompt: id, set, prompt, expected keywords, then `<label>` answer and `<label> hits`."""
    rows = []
    for p in summary["prompts"]:
        row = {"prompt_id": p["id"], "set": p["set"], "prompt": p["prompt"],
               "keywords": ", ".join(p.get("keywords", []))}
        for ck in summary["checkpoints"]:
            rec = generations.get(ck["label"], {}).get(p["id"])
            row[ck["label"]] = rec["text"] if rec else ""
            row[f"{ck['label']} hits"] = (f"{len(rec['keyword_hits'])}/{len(rec['keywords'])}" if rec else "")
        rows.append(row)
    return rows


def table_rows(stage_dir: str | Path) -> list[dict]:
    """comparison_rows straight from a finished (local) evaluate stage folder."""
    summary = json.loads((Path(stage_dir) / "metrics.json").read_text(encoding="utf-8"))
    return comparison_rows(summary, load_generations(stage_dir, summary))


def _md_cell(value) -> str:
    text = "" if value is None else str(value)
    text = text.replace("<", "\\<").replace(">", "\\>")  # a file name is no HTML tag (issue 45)
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>") or " "


def md_table(rows: list[dict]) -> str:
    if not rows:
        return "_(none)_\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(_md_cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_md_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def reading_rows(summary: dict) -> list[dict]:
    """The checkpoint table of the reading view: narrow columns (sources are listed under it)."""
    return [{"checkpoint": r["checkpoint"], "perplexity": r["perplexity"],
             **{f"{name} ppl": _round(v) for name, v in r["reference"].items()}, "keyword hits": r["keyword_hits"],
             "generated tokens": r["generated_tokens"], "tokens/s": _round(r["tokens_per_s"])}
            for r in summary_rows(summary)]


def task_rows(summary: dict) -> list[dict]:
    """The accuracy table: one row per task, one column per checkpoint (accuracy, then acc_norm in brackets)."""
    rows = []
    for t in summary.get("tasks") or []:
        row = {"task": t["name"], "type": t["type"].replace("_", " "), "items": t["items"]}
        for ck in summary["checkpoints"]:
            r = (ck.get("tasks") or {}).get(t["name"])
            row[ck["label"]] = f"{r['accuracy']:.3f} ({r['accuracy_norm']:.3f})" if r else ""
        first = next((ck["tasks"][t["name"]] for ck in summary["checkpoints"] if t["name"] in (ck.get("tasks") or {})),
                     None)
        row["chance"] = f"{first['chance']:.3f}" if first else ""
        rows.append(row)
    return rows


TASKS_NOTE = ("Accuracy by log-likelihood: the candidate (choice or label) the model finds likeliest after the "
              "prompt is its answer; in brackets the same with the log-likelihood per character (acc_norm).\n")


def _round(value, digits: int = 4):
    return float(f"{value:.{digits}g}") if isinstance(value, float) else value


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~])")
_LONG_WORD = re.compile(r"\S{60,}")


def md_quote(text: str) -> str:
    """Model output as a one-paragraph quote a markdown renderer shows as written: markdown and HTML
    characters backslash-escaped (the Prefect UI renders raw HTML tags), newlines as <br>, and a
    zero-width space every 40 characters of a very long word so the page can wrap it."""
    text = _LONG_WORD.sub(lambda m: "\u200b".join(m.group(0)[i:i + 40] for i in range(0, len(m.group(0)), 40)),
                          (text or "").replace("\r", ""))
    return "> " + (_MD_SPECIAL.sub(r"\\\1", text).replace("\n", "<br>") or " ")


REPLACEMENT = "\ufffd"  # what a byte sequence that is no UTF-8 character decodes to


def byte_fallback_note(generations: dict) -> str | None:
    """Why answers show "\ufffd" (None when none does): the tokenizer's byte-fallback pieces the model emitted in an
    order that makes no UTF-8 character (a little-trained model does), decoded as the replacement character."""
    answers = [rec for by_prompt in generations.values() for rec in by_prompt.values()
               if isinstance(rec, dict) and REPLACEMENT in str(rec.get("text", ""))]
    if not answers:
        return None
    return (f"{len(answers)} answer(s) contain \"{REPLACEMENT}\": the model emitted byte-fallback pieces (<0x..> "
            "tokens, one byte of a character each) that form no whole UTF-8 character, and decoding shows each such "
            "byte run as \"\ufffd\". It is what the model wrote, not a rendering fault; a model trained longer emits "
            "whole characters.")


def render_markdown(summary: dict, generations: dict, title: str = "Evaluation") -> str:
    """The reading view: perplexity per checkpoint on top, then per prompt the answers of every
    checkpoint stacked one under the other (never a table as wide as the number of checkpoints)."""
    labels = [ck["label"] for ck in summary["checkpoints"]]
    parts = [f"# {title}\n",
             f"Checkpoints: {', '.join(labels)}. Decoding: {summary.get('decoding', '')}, "
             f"max {summary.get('max_new_tokens', '')} new tokens, device {summary.get('device', '')} "
             f"({summary.get('decode_path', '')} path). Keyword hits: expected keywords found in the answer.\n",
             "## Checkpoints\n", md_table(reading_rows(summary)),
             "\n".join(f"- {_md_cell(ck['label'])}: `{_source(ck['ref'])}`" for ck in summary["checkpoints"]) + "\n"]
    if summary.get("tasks"):
        parts += ["## Task accuracy\n", TASKS_NOTE, md_table(task_rows(summary))]
    parts.append("## Answers per prompt\n")
    note = byte_fallback_note(generations)
    if note:
        parts.append(f"_{note}_\n")
    for p in summary["prompts"]:
        kws = p.get("keywords", [])
        parts.append(f"### {p['id']} ({p['set']})\n\n{md_quote(p['prompt'])}\n")
        if kws:
            parts.append(f"Expected keywords: {', '.join(kws)}\n")
        for label in labels:
            rec = generations.get(label, {}).get(p["id"])
            if rec is None:
                parts.append(f"**{label}**: _missing_\n")
                continue
            hits = f"{len(rec['keyword_hits'])}/{len(rec['keywords'])} hits, " if rec.get("keywords") else ""
            broken = rec["text"].count(REPLACEMENT)
            hits += f"{broken} \"{REPLACEMENT}\", " if broken else ""
            parts.append(f"**{label}** ({hits}{rec.get('num_tokens', '?')} tokens, {rec.get('stop_reason', '')})\n\n"
                         f"{md_quote(rec['text'])}\n")
    return "\n".join(parts)


def _highlight(text: str, keywords: list[str]) -> str:
    out = html.escape(text)
    pats = [re.escape(html.escape(k)) for k in sorted({k for k in keywords if k.strip()}, key=len, reverse=True)]
    if pats:  # one pass, so a keyword never matches inside an inserted tag
        out = re.sub("|".join(pats), lambda m: f"<mark>{m.group(0)}</mark>", out, flags=re.IGNORECASE)
    return out.replace("\n", "<br>")


def _html_table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def render_html(summary: dict, generations: dict, title: str = "Evaluation") -> str:
    """The same reading view as render_markdown, self-contained HTML with the keywords highlighted."""
    srows = reading_rows(summary)
    s_cols = list(srows[0]) if srows else []
    s_table = _html_table(s_cols, [[html.escape("" if r[c] is None else str(r[c])) for c in s_cols] for r in srows])
    sources = "".join(f"<li>{html.escape(ck['label'])}: <code>{html.escape(_source(ck['ref']))}</code></li>"
                      for ck in summary["checkpoints"])
    trows = task_rows(summary)
    t_table = (f"<h2>Task accuracy</h2><p>{html.escape(TASKS_NOTE)}</p>" + _html_table(
        list(trows[0]), [[html.escape(str(r[c])) for c in r] for r in trows])) if trows else ""
    labels = [ck["label"] for ck in summary["checkpoints"]]
    body = []
    for p in summary["prompts"]:
        kws = p.get("keywords", [])
        expected = f"<p class=\"kw\">Expected keywords: {html.escape(', '.join(kws))}</p>" if kws else ""
        answers = []
        for label in labels:
            rec = generations.get(label, {}).get(p["id"])
            if rec is None:
                answers.append(f"<div class=\"answer\"><h4>{html.escape(label)}</h4><i>missing</i></div>")
                continue
            answers.append(f"<div class=\"answer\"><h4>{html.escape(label)} <small>{len(rec['keyword_hits'])}/"
                           f"{len(kws)} hits, {rec['num_tokens']} tokens, {html.escape(str(rec['stop_reason']))}"
                           f"</small></h4><div class=\"text\">{_highlight(rec['text'], kws)}</div></div>")
        body.append(f"<section class=\"prompt\"><h3>{html.escape(p['id'])} <small>{html.escape(p['set'])}</small>"
                    f"</h3><blockquote>{html.escape(p['prompt']).replace(chr(10), '<br>')}</blockquote>{expected}"
                    + "".join(answers) + "</section>")
    esc = lambda key: html.escape(str(summary.get(key, "")))  # noqa: E731
    style = ("body{font-family:sans-serif;margin:1.5em;max-width:70em}table{border-collapse:collapse;margin-bottom:1em}"
             "td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}th{background:#f3f3f3}"
             "mark{background:#ffe58a}blockquote{margin:0 0 .5em;padding:.3em .8em;border-left:4px solid #ccc}"
             ".answer{margin:.4em 0 .8em 1em}.answer h4{margin:.2em 0}.text{overflow-wrap:anywhere}"
             "section.prompt{border-top:1px solid #ddd;padding-top:.5em}")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p>Decoding: {esc('decoding')}, device {esc('device')} ({esc('decode_path')} path)</p>"
            f"<h2>Checkpoints</h2>{s_table}<ul>{sources}</ul>{t_table}<h2>Answers per prompt</h2>"
            + "".join(body) + "</body></html>")
