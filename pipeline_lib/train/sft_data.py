"""SFT rows and files: instruction records -> packed (input_ids, labels) rows -> MindRecord + reports.

Row format (what mindformers 1.9 `LlamaForCausalLM.construct` consumes in training): `input_ids` and
`labels`, both int32 and exactly `seq_length + 1` long. The model shifts by itself: it feeds
`input_ids[:, :-1]`, scores `labels[:, 1:]`, and masks a position whose input token is pad or whose
label is -100. So `labels[i] = input_ids[i]` where token i is trained (answer tokens and the EOS ending
each answer, see model/chat_template.py) and -100 elsewhere (BOS, markers, system/user text, pad).

Packing (sft.packing): samples are placed in input order, each whole, into the current row while they
fit, else a new row starts; rows are right-padded (pad id, label -100). Labels stay per sample (the
BOS of a packed sample is -100, so nothing is learned across a boundary), but attention is not reset
between packed samples (mindformers resets it only with Ascend flash attention). Without packing each
sample is one row.

`prepare_sft_data(cfg, tokenizer, out_dir)` writes into out_dir: `data/sft.mindrecord` (+ .db, and
`.rows_sha256`: the same rows are not written twice),
`quarantine.jsonl` (malformed records: id, file, line, reason, field (the one it has wrong, or null), raw), `excluded.jsonl` (samples dropped by
sft.truncation: id, file, line, reason, tokens) and `sft_stats.json` (per file and in total: read,
rejected and dropped by reason, kept, shapes, tokens, trained tokens, rows; `balanced` is
read = rejected + dropped + kept). The MindRecord file is written by a MindSpore subprocess
(`python -m pipeline_lib.storage.mindrecord ROWS.npz OUT.mindrecord sft`); the rest is numpy only.
Instruction records come from instructions.py, the chat template and the tokenizer from model/.
Raises SftDataError naming sft.inputs / model.seq_length / sft.micro_batch_size when too little
data is left to train on; RuntimeError when the accounting does not add up (a bug).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable

import numpy as np

from ..config.load import is_utf8_text
from ..model.chat_template import IGNORE, fit_to_row, labels_for, template_for
from ..model.token_ids import TokenIds
from ..model.tokenizer import Tokenizer
from ..runtime.launcher import launch_module
from ..storage import join, store_for
from ..storage.mindrecord import read_mindrecord_columns
from .instructions import SftDataError, iter_instruction_records, offending_field, shape_keys, shape_of, to_turns

DATA_FILE = "data/sft.mindrecord"
STATS_FILE = "sft_stats.json"


@dataclass
class PackedRows:
    """`input_ids` / `labels` [rows, row_len] int32 and, per row, the (start, end) of each sample."""

    input_ids: np.ndarray
    labels: np.ndarray
    spans: list[list[tuple[int, int]]]

    @property
    def trained_tokens(self) -> int:
        return int((self.labels[:, 1:] != IGNORE).sum())


def pack(samples: list[tuple[list[int], list[bool]]], row_len: int, pad_id: int, packing: bool) -> PackedRows:
    """Rows of samples (each already fitting `row_len`), see the module docstring."""
    rows: list[list[tuple[list[int], list[bool]]]] = []
    used = row_len + 1  # forces a new row for the first sample
    for ids, trained in samples:
        if len(ids) > row_len:
            raise ValueError(f"a sample of {len(ids)} tokens does not fit a row of {row_len}; fit_to_row first")
        if not packing or used + len(ids) > row_len:
            rows.append([])
            used = 0
        rows[-1].append((ids, trained))
        used += len(ids)
    input_ids = np.full((len(rows), row_len), pad_id, dtype=np.int32)
    labels = np.full((len(rows), row_len), IGNORE, dtype=np.int32)
    spans = []
    for r, row in enumerate(rows):
        pos, row_spans = 0, []
        for ids, trained in row:
            input_ids[r, pos:pos + len(ids)] = ids
            labels[r, pos:pos + len(ids)] = labels_for(ids, trained)
            row_spans.append((pos, pos + len(ids)))
            pos += len(ids)
        spans.append(row_spans)
    return PackedRows(input_ids, labels, spans)


def _blank_counts(uri: str) -> dict:
    return {"uri": uri, "read": 0, "rejected": Counter(), "dropped": Counter(), "kept": 0, "shapes": Counter(),
            "tokens": 0, "trained_tokens": 0}


def build_sft_rows(records: Iterable, template, tok, *, row_len: int, truncation: str, packing: bool,
                   system_prompt: str | None = None, quarantine: IO[str] | None = None,
                   excluded: IO[str] | None = None, threads: int = 2, batch: int = 512) -> tuple[PackedRows, dict]:
    """Records (instructions.RawRecord) -> packed rows and per-file counts.

    Malformed records go to `quarantine` (id, file, line, reason, field, raw), samples dropped by the
    truncation policy to `excluded` (id, file, line, reason, tokens). Per file and in total:
    read = rejected + dropped + kept (`balanced`).
    """
    files: dict[str, dict] = {}
    samples: list[tuple[list[int], list[bool]]] = []
    pending: list[tuple] = []

    def flush() -> None:
        encoded = template.encode(tok, [turns for _, turns in pending], threads=threads)
        for (rec, _), (ids, trained) in zip(pending, encoded):
            counts, n = files[rec.uri], len(ids)
            ids, trained, reason = fit_to_row(ids, trained, row_len, truncation)
            if reason:
                counts["dropped"][reason] += 1
                if excluded is not None:
                    excluded.write(json.dumps({"id": rec.id, "file": rec.uri, "line": rec.line, "reason": reason,
                                               "tokens": n}) + "\n")
                continue
            counts["kept"] += 1
            counts["tokens"] += len(ids)
            counts["trained_tokens"] += sum(trained[1:])
            samples.append((ids, trained))
        pending.clear()

    for rec in records:
        counts = files.setdefault(rec.uri, _blank_counts(rec.uri))
        counts["read"] += 1
        turns, reason = (None, rec.reason) if rec.obj is None else to_turns(
            rec.obj, system_prompt=system_prompt, forbidden=template.forbidden_text)
        if reason:
            counts["rejected"][reason] += 1
            if quarantine is not None:
                raw = rec.raw if rec.obj is None else json.dumps(rec.obj, ensure_ascii=False, default=str)
                field = offending_field(rec.obj, reason, template.forbidden_text)
                quarantine.write(_utf8_json({"id": rec.id, "file": rec.uri, "line": rec.line, "reason": reason,
                                             "field": field, "raw": raw}) + "\n")
            continue
        counts["shapes"][shape_of(rec.obj)] += 1
        pending.append((rec, turns))
        if len(pending) >= batch:
            flush()
    if pending:
        flush()
    rows = pack(samples, row_len, template.pad_id, packing)
    return rows, summarize(files, rows)


def _utf8_json(obj) -> str:
    """JSON for a UTF-8 file: non-ASCII as written, unless a lone surrogate (from a \\udXXX escape in the
    input) is inside: then everything is escaped (valid JSON; the surrogate cannot be written as UTF-8)."""
    text = json.dumps(obj, ensure_ascii=False)
    return text if is_utf8_text(text) else json.dumps(obj)


def summarize(files: dict[str, dict], rows: PackedRows) -> dict:
    """JSON-ready counts per file and in total, with the conservation check."""
    total = _blank_counts("")
    out = {}
    for uri, c in files.items():
        for key in ("read", "kept", "tokens", "trained_tokens"):
            total[key] += c[key]
        for key in ("rejected", "dropped", "shapes"):
            total[key] += c[key]
        out[uri] = c
    for c in (*out.values(), total):
        for key in ("rejected", "dropped", "shapes"):
            c[key] = dict(sorted(c[key].items()))
        c["rejected_total"], c["dropped_total"] = sum(c["rejected"].values()), sum(c["dropped"].values())
        c["balanced"] = c["read"] == c["rejected_total"] + c["dropped_total"] + c["kept"]
    total.pop("uri")
    total.update(rows=int(len(rows.input_ids)), row_tokens=int(rows.input_ids.shape[1]) if len(rows.input_ids) else 0,
                 row_trained_tokens=rows.trained_tokens)
    return {"files": out, "total": total, "balanced": all(c["balanced"] for c in (*out.values(), total)),
            "conservation": "read = rejected + dropped + kept"}


def _counts(counter: dict) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in sorted(counter.items(), key=lambda kv: -kv[1]))


def first_quarantined(path: Path, limit: int = 3) -> list[str]:
    """The first record of each reason in a quarantine file, said as `reason at file:line (field F)`; a record of no
    known shape with the keys it has and the ones a shape needs (instructions.shape_keys). At most `limit`."""
    seen: dict[str, str] = {}
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["reason"] in seen:
                continue
            detail = f"field {rec['field']}" if rec.get("field") else None
            if rec["reason"] == "unknown_shape":
                try:
                    detail = shape_keys(json.loads(rec["raw"]))
                except ValueError:
                    pass
            seen[rec["reason"]] = f"{rec['reason']} at {rec['file']}:{rec['line']}" + (f" ({detail})" if detail else "")
            if len(seen) >= limit:
                break
    return list(seen.values())


def too_few_rows(cfg, total: dict, out: Path, where: str | None = None, first: list[str] | None = None
                 ) -> SftDataError:
    """The error for fewer rows than one batch: the counts per reason with the first record of each (`first`:
    first_quarantined), the files that list those records (in `where`, the stage folder they were written to;
    default `out`), and only the changes that are not already made."""
    need = cfg.sft.micro_batch_size * cfg.parallel.data_parallel
    folder = (where or str(out)).rstrip("/")
    said = [f"{total['kept']} usable samples in {total['rows']} rows of {total['read']} records"]
    if total["rejected_total"]:
        said.append(f"{total['rejected_total']} malformed ({_counts(total['rejected'])}"
                    + (f"; first: {'; '.join(first)}" if first else "")
                    + f"; each with its reason and field in {folder}/quarantine.jsonl)")
    if total["dropped_total"]:
        said.append(f"{total['dropped_total']} too long for a row ({_counts(total['dropped'])}; in "
                    f"{folder}/excluded.jsonl)")
    fixes = ["correct the quarantined records"] if total["rejected_total"] else []
    fixes.append("add instruction data")
    if total["dropped_total"]:
        fixes.append(f"raise model.seq_length (now {cfg.model.seq_length})")
        if cfg.sft.truncation == "drop":
            fixes.append("use sft.truncation=truncate_prompt")
    if cfg.sft.micro_batch_size > 1:
        fixes.append(f"lower sft.micro_batch_size (now {cfg.sft.micro_batch_size})")
    return SftDataError("sft.inputs", list(cfg.sft.inputs),
                        "; ".join(said) + f": fewer than one batch of sft.micro_batch_size x data_parallel = {need}",
                        ", ".join(fixes[:-1]) + (" or " if len(fixes) > 1 else "") + fixes[-1])


def prepare_sft_data(cfg, tokenizer_path: str | Path, out_dir: str | Path, endpoint_url: str | None = None,
                     log=None, stage_uri: str | None = None) -> dict:
    """Write the SFT data files into out_dir (see the module docstring); returns the stats dict. `stage_uri`: the
    run store's stage folder when out_dir is a local work folder (an s3:// store): a refusal uploads the quarantine
    and excluded files there first, and names them there."""
    out = Path(out_dir)
    (out / DATA_FILE).parent.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(tokenizer_path)
    template = template_for(cfg.sft.template, tok, cfg.tokenizer.special_tokens)
    records = iter_instruction_records(list(cfg.sft.inputs), endpoint_url, max_line=cfg.data.max_line_bytes)
    with open(out / "quarantine.jsonl", "w", encoding="utf-8") as q, open(out / "excluded.jsonl", "w") as x:
        rows, stats = build_sft_rows(records, template, tok, row_len=cfg.model.seq_length + 1,
                                     truncation=cfg.sft.truncation, packing=cfg.sft.packing,
                                     system_prompt=cfg.sft.system_prompt, quarantine=q, excluded=x,
                                     threads=cfg.tokenizer.encode_threads)
    stats["token_ids"] = TokenIds.read(tokenizer_path).as_dict()  # what the generated yaml uses
    stats["template"] = {"name": cfg.sft.template, "markers": template.markers, "bos_id": template.bos_id, "eos_id": template.eos_id,
                         "pad_id": template.pad_id, "truncation": cfg.sft.truncation, "packing": cfg.sft.packing}
    # identity of the rows (the MindRecord bytes are not reproducible: its header differs per write)
    stats["rows_sha256"] = hashlib.sha256(rows.input_ids.tobytes() + rows.labels.tobytes()).hexdigest()
    (out / STATS_FILE).write_text(json.dumps(stats, indent=2, ensure_ascii=False), encoding="utf-8")
    t = stats["total"]
    if not stats["balanced"]:
        raise RuntimeError(f"SFT accounting does not add up (read != rejected + dropped + kept); see {out / STATS_FILE}")
    if t["rows"] < cfg.sft.micro_batch_size * cfg.parallel.data_parallel:
        if stage_uri:  # named where a person looks (the run store), so there before the message is
            for name in ("quarantine.jsonl", "excluded.jsonl", STATS_FILE):
                store_for(stage_uri, endpoint_url).put_file(out / name, join(stage_uri, name))
        raise too_few_rows(cfg, t, out, stage_uri, first_quarantined(out / "quarantine.jsonl"))
    marker = out / (DATA_FILE + ".rows_sha256")  # the same rows are not written again (a resumed run)
    if not ((out / DATA_FILE).exists() and marker.exists() and marker.read_text() == stats["rows_sha256"]):
        marker.unlink(missing_ok=True)
        npz = out / "data" / ".rows.npz"
        np.savez(npz, input_ids=rows.input_ids, labels=rows.labels)
        written = launch_module("pipeline_lib.storage.mindrecord", [str(npz), str(out / DATA_FILE), "sft"],
                                cwd=None, timeout_s=600)
        npz.unlink(missing_ok=True)
        if not written.ok:
            raise RuntimeError(f"writing {out / DATA_FILE} failed: " + written.describe("mindrecord writer"))
        marker.write_text(stats["rows_sha256"])
    if log:
        log(f"sft: {t['read']} records -> {t['kept']} samples ({t['rejected_total']} quarantined, "
            f"{t['dropped_total']} dropped), {t['rows']} rows, {t['row_trained_tokens']} trained tokens")
    return stats


def table_rows(stats: dict) -> list[dict]:
    """One row per input file plus a TOTAL row, for a table artifact."""
    def row(name, c):
        return {"file": name, "read": c["read"], "rejected": c["rejected_total"], "dropped": c["dropped_total"],
                "kept": c["kept"], "trained_tokens": c["trained_tokens"], "balanced": c["balanced"]}
    return [row(Path(uri).name, c) for uri, c in stats["files"].items()] + [row("TOTAL", stats["total"])]


def read_sft_mindrecord(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, labels) of the SFT rows file, read back through mindspore.dataset (for checks)."""
    cols = read_mindrecord_columns([path], ["input_ids", "labels"])
    return cols["input_ids"], cols["labels"]
