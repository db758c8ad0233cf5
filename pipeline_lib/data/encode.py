"""Steps 4-6 of the data stage: the tokenizer, tokenizing each shard, writing MindRecord shards.

- `build_tokenizer`: load `tokenizer.path` (checked against the config) or train on a uniform,
  reproducible sample of `tokenizer.sample_lines` lines of the kept training documents, drawn by the
  shard workers in prep_shard and merged here (tokenizer_sample.py: deterministic, whatever the
  workers; every line, in input order, below sample_lines): this process does not read the corpus.
- `write_cleaned_shard` (mapped over shards, needs no tokenizer: runs while it trains): kept
  documents -> cleaned/part-<k>.jsonl.gz.
- `tokenize_shard` (mapped over shards): the token streams of its train and held-out documents
  (tokens + EOS each), with the documents' ids and token counts (shards/<k>/spans_<split>.jsonl);
  it writes the cleaned part first when write_cleaned_shard has not.
- `plan_mindrecord` then `write_mindrecord_shard` (mapped over (split, j)) or `write_mindrecord_files`
  (a group of them in one task): MindRecord file j of a split holds rows [j*R, (j+1)*R) of the
  split's packed stream, R = `rows_per_file` (data.mindrecord_file_mb of rows, or
  data.rows_per_mindrecord_shard), and its sidecar shard-<j>.docs.jsonl names the documents packed
  in it (`doc_spans`).
All are idempotent through their completion markers.
Raises: DataStageError when the kept data give no full training row.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
from isal import igzip

from .. import killpoints
from ..model.token_ids import CONFIG_NAME
from ..model.tokenizer import Tokenizer
from .errors import DataStageError
from ..model.packing import (count_rows, document_attention_mask, join_with_eos, mask_bytes_per_row,
                             rows_from_tokens)
from .packing import gather_tokens, heldout_mask, write_mindrecord
from .prep import read_docs, shard_dir
from .replay import prepare_replay, replay_rows, replay_sidecar_lines
from .tokenizer import check_loaded, lineage_tokenizer_checked, load_base, train_on_sample, write_config
from .tokenizer_sample import merged_sample
from .workspace import Workspace, atomic_path

SPLITS = ("train", "heldout")


def _keep(ws: Workspace, k: int) -> np.ndarray:
    """Which of shard k's candidate documents dedup kept."""
    return np.load(ws.fetch(f"{shard_dir(k)}/keep.npy")) == 0


def _kept(ws: Workspace, k: int, columns: list[str]):
    table = read_docs(ws, k, columns)
    keep = _keep(ws, k)
    return {c: np.asarray(table.column(c).to_numpy(zero_copy_only=False))[keep] for c in columns}


def build_tokenizer(cfg, paths, *, shared: bool = True) -> dict:
    """Load or train tokenizer/tokenizer.model; returns its description (ids, vocab size)."""
    ws, t = Workspace(cfg, paths, shared), cfg.tokenizer
    if ws.is_marked("tokenizer"):
        return ws.read_json(f"tokenizer/{CONFIG_NAME}")
    out = ws.local("tokenizer/tokenizer.model")
    given = lineage_tokenizer_checked(cfg)  # tokenizer.path, else the base weights' own: never a new one for them
    if given:
        from ..storage import store_for

        store_for(given, ws.endpoint).get_file(given, out)
        tok = load_base(out, t, cfg.sft.template)
        check_loaded(tok, t, cfg.model.vocab_size)
        write_config(tok, f"loaded from {given}")
    else:
        summary = ws.read_json("shards/dedup.json")["shards"]
        kept = sum(s["kept"] for s in summary)
        if kept == 0:
            raise DataStageError("data.inputs", list(cfg.data.inputs), "no document survived cleaning and dedup "
                                 "(see quarantine.jsonl and excluded.jsonl under shards/ of the stage folder)",
                                 "check data.text_field and data.filters")

        def candidates(k):  # a shard whose workers' sample fell short is read again (tokenizer_sample.py)
            table = read_docs(ws, k, ["text", "key"])
            return table.column("text").to_pylist(), table.column("key").to_numpy()

        sample, seen = merged_sample(ws, cfg, len(summary), lambda k: _keep(ws, k), candidates)
        tok = train_on_sample(sample, seen, t, out.parent)
        if tok.vocab_size > cfg.model.vocab_size:
            raise DataStageError("model.vocab_size", cfg.model.vocab_size, f"the tokenizer has {tok.vocab_size} pieces",
                                 f"set model.vocab_size >= {tok.vocab_size} or lower tokenizer.vocab_size")
    ws.publish("tokenizer/tokenizer.model", f"tokenizer/{CONFIG_NAME}")
    ws.mark("tokenizer")
    killpoints.reached("data.after_tokenizer")
    return ws.read_json(f"tokenizer/{CONFIG_NAME}")


_JSON = json.JSONEncoder(ensure_ascii=False).encode  # one encoder: json.dumps(..., ensure_ascii=False) builds one per call


def write_cleaned_shard(cfg, paths, index: int, *, shared: bool = True) -> str:
    """Write cleaned/part-<index>.jsonl.gz (the shard's kept documents with their split). It needs no
    tokenizer: the stage runs it while the tokenizer trains. Returns its path in the stage folder."""
    ws = Workspace(cfg, paths, shared)
    part = f"cleaned/part-{index:05d}.jsonl.gz"
    if ws.is_marked(f"{index:05d}.cleaned"):
        return part
    kept = _kept(ws, index, ["origin", "source_id", "meta", "text", "key"])
    held = heldout_mask(kept["key"], cfg.data.heldout_fraction)
    tmp = atomic_path(ws.local(part))
    # source_id and meta are already JSON text (ensure_ascii=False): spliced in as they are, the line is
    # what json.dumps of the decoded record gives, without decoding and encoding them again
    lines = [f'{{"id": {sid}, "origin": {_JSON(origin)}, "text": {_JSON(text)}, '
             f'"split": "{"heldout" if h else "train"}", "meta": {meta}}}\n'
             for origin, sid, meta, text, h in zip(kept["origin"], kept["source_id"], kept["meta"], kept["text"], held)]
    # ISA-L's gzip at its level 2: 4x faster than zlib's level 1 on this text (0.06 s vs 0.23 s for 17 MB, a
    # fifth of the cleaned parts' work while the tokenizer trains) and ~0.4% smaller; any gzip reader reads it
    with open(tmp, "wb") as raw:
        raw.write(igzip.compress("".join(lines).encode("utf-8"), 2, mtime=0))
    os.replace(tmp, ws.local(part))
    ws.publish(part)
    ws.mark(f"{index:05d}.cleaned")
    return part


def tokenize_shard(cfg, paths, index: int, *, shared: bool = True) -> dict:
    """Write the shard's train/held-out token streams (and its cleaned part, when write_cleaned_shard
    has not run)."""
    ws = Workspace(cfg, paths, shared)
    folder = shard_dir(index)
    if ws.is_marked(f"{index:05d}.tokens"):
        return ws.read_json(f"{folder}/tokens.json")
    write_cleaned_shard(cfg, paths, index, shared=shared)
    ws.fetch(f"tokenizer/{CONFIG_NAME}")
    tok = Tokenizer(ws.fetch("tokenizer/tokenizer.model"))
    kept = _kept(ws, index, ["origin", "source_id", "text", "key"])
    held = heldout_mask(kept["key"], cfg.data.heldout_fraction)
    encoded = tok.encode_arrays(list(kept["text"]), threads=cfg.tokenizer.encode_threads)
    counts = {"kept_train": int((~held).sum()), "kept_heldout": int(held.sum())}
    for split, mask in (("train", ~held), ("heldout", held)):
        stream = join_with_eos([e for e, m in zip(encoded, mask) if m], tok.eos_id)
        np.save(ws.local(f"{folder}/tokens_{split}.npy"), stream)
        counts[f"tokens_{split}"] = int(len(stream))
        with open(ws.local(f"{folder}/spans_{split}.jsonl"), "w", encoding="utf-8") as fh:
            for origin, sid, e, m in zip(kept["origin"], kept["source_id"], encoded, mask):
                if m:  # source_id is already JSON text
                    fh.write(f'{{"id": {sid}, "origin": {_JSON(origin)}, '
                             f'"tokens": {len(e) + 1}}}\n')
    ws.publish(*[f"{folder}/{kind}_{split}.{ext}" for split in SPLITS
                 for kind, ext in (("tokens", "npy"), ("spans", "jsonl"))])
    ws.write_json(f"{folder}/tokens.json", counts)
    ws.mark(f"{index:05d}.tokens")
    return counts


def plan_mindrecord(cfg, paths, *, shared: bool = True) -> list[tuple[str, int]]:
    """Rows and files per split (shards/mindrecord.json); returns the (split, file index) work items."""
    ws, d = Workspace(cfg, paths, shared), cfg.data
    n_shards = len(ws.read_json("shards/plan.json")["shards"])
    counts = [ws.read_json(f"{shard_dir(k)}/tokens.json") for k in range(n_shards)]
    row_len = cfg.model.seq_length + 1
    per_file = rows_per_file(cfg)
    plan, items = {}, []
    replay = prepare_replay(cfg, paths, shared=shared)["rows"]  # done already where MindSpore is warm (stage.py)
    for split in SPLITS:
        per_shard = [c[f"tokens_{split}"] for c in counts]
        new_rows = count_rows(sum(per_shard), row_len, d.remainder)
        extra = replay if split == "train" and new_rows else 0  # replay rows follow the new ones (replay.py)
        files = math.ceil((new_rows + extra) / per_file)
        plan[split] = {"token_counts": per_shard, "rows": new_rows + extra, "new_rows": new_rows,
                       "replay_rows": extra, "files": files, "row_len": row_len, "rows_per_file": per_file}
        items += [(split, j) for j in range(files)]
    if plan["train"]["rows"] == 0:
        total = sum(plan["train"]["token_counts"])
        raise DataStageError("model.seq_length", cfg.model.seq_length,
                             f"the kept training documents hold {total} tokens, not one row of {row_len}",
                             "add input data, lower model.seq_length, or set data.remainder=pad")
    ws.write_json("shards/mindrecord.json", plan)
    return items


def rows_per_file(cfg) -> int:
    """Packed rows per MindRecord file: data.rows_per_mindrecord_shard when set, else as many
    rows of 4-byte tokens (+ their attention mask with data.packing.document_mask) as fit in
    data.mindrecord_file_mb (at least one)."""
    d = cfg.data
    if d.rows_per_mindrecord_shard:
        return d.rows_per_mindrecord_shard
    seq = cfg.model.seq_length
    row_bytes = 4 * (seq + 1) + (mask_bytes_per_row(seq) if d.packing.document_mask else 0)
    return max(1, int(d.mindrecord_file_mb * (1 << 20)) // row_bytes)


def file_rows(plan: dict, split: str, j: int) -> int:
    """Rows of MindRecord file j of `split` in a plan_mindrecord plan (shards/mindrecord.json)."""
    p = plan[split]
    return max(min(p["rows_per_file"], p["rows"] - j * p["rows_per_file"]), 0)


def mindrecord_groups(items: list[tuple[str, int]], n_groups: int,
                      plan: dict | None = None) -> list[list[tuple[str, int]]]:
    """`items` cut into at most n_groups groups (one task each: the MindSpore import and the task's
    scheduling are paid per group, not per file) of nearly equal rows (file_rows of `plan`; equal
    weights without one): the largest file first to the group with the fewest rows so far. Cut in
    input order instead, the last group of a split's full files and its small last file and held-out
    file left one worker idle for a third of the step. Items keep their input order in a group."""
    n = max(1, min(n_groups, len(items)))
    weight = [file_rows(plan, *item) if plan else 1 for item in items]
    loads, members = [0] * n, [[] for _ in range(n)]
    for i in sorted(range(len(items)), key=lambda i: -weight[i]):  # stable: equal files in input order
        g = loads.index(min(loads))
        loads[g] += weight[i]
        members[g].append(i)
    return [[items[i] for i in sorted(m)] for m in members if m]


def mindrecord_name(split: str, j: int) -> str:
    return f"mindrecord/{split}/shard-{j:05d}.mindrecord"


def sidecar_name(split: str, j: int) -> str:
    return f"mindrecord/{split}/shard-{j:05d}.docs.jsonl"


def doc_spans(docs: list[tuple[str, int]], doc_start: int, start: int, stop: int, row_len: int) -> list[str]:
    """Sidecar lines for the documents `docs` (in stream order, the first starting at token `doc_start`
    of the split's stream: each its JSON head '{"id": ..., "origin": ...' and its token count) that
    overlap the file's tokens [start, stop). Offsets are in the file's flattened rows (row r holds
    [r*row_len, (r+1)*row_len)): token_start/token_end (end exclusive, the document's EOS included),
    row_start/row_end (inclusive), whole: the document's every token is in this file."""
    out, pos = [], doc_start
    for head, n in docs:
        a, b = pos, pos + n
        pos = b
        if b <= start:
            continue
        if a >= stop:
            break
        lo, hi = max(a, start) - start, min(b, stop) - start
        whole = "true" if a >= start and b <= stop else "false"
        out.append(f'{head}, "row_start": {lo // row_len}, "row_end": {(hi - 1) // row_len}, '
                   f'"token_start": {lo}, "token_end": {hi}, "whole": {whole}}}\n')
    return out


def _span_heads(lines) -> list[tuple[str, int]]:
    """(JSON head, tokens) of spans_<split>.jsonl lines '{"id": ..., "origin": ..., "tokens": N}': the last
    key is ours (a quote inside the origin string is escaped), so no decoding and encoding per document."""
    out = []
    for line in lines:
        head, _, n = line.rpartition(', "tokens": ')
        out.append((head, int(n.rstrip("}\n"))))
    return out


def write_mindrecord_shard(cfg, paths, split: str, j: int, *, shared: bool = True) -> str:
    """Pack and write MindRecord file j of `split` and its sidecar (the documents in its rows);
    returns the MindRecord path relative to the stage folder."""
    ws, d = Workspace(cfg, paths, shared), cfg.data
    rel = mindrecord_name(split, j)
    if ws.is_marked(f"mr-{split}-{j:05d}"):
        return rel
    plan = ws.read_json("shards/mindrecord.json")[split]
    row_len, per = plan["row_len"], plan["rows_per_file"]
    first_row, last_row = j * per, min((j + 1) * per, plan["rows"])
    new_rows = plan.get("new_rows", plan["rows"])
    last_new = max(min(last_row, new_rows), first_row)  # rows past new_rows are replay rows (replay.py)
    start, stop = first_row * row_len, min(last_new * row_len, sum(plan["token_counts"]))
    parts, spans, offset = [], [], 0
    for k, n in enumerate(plan["token_counts"]):
        if n and offset < stop and offset + n > start:
            parts.append((offset, np.load(ws.fetch(f"{shard_dir(k)}/tokens_{split}.npy"), mmap_mode="r")))
            with open(ws.fetch(f"{shard_dir(k)}/spans_{split}.jsonl"), encoding="utf-8") as fh:
                spans += doc_spans(_span_heads(fh), offset, start, stop, row_len)
        offset += n
    ids = ws.read_json(f"tokenizer/{CONFIG_NAME}")  # the tokenizer's, not the config's
    rows = rows_from_tokens(gather_tokens(parts, start, stop), row_len, d.remainder, ids["pad_id"])
    if last_row > last_new:
        lo, hi = last_new - new_rows, last_row - new_rows
        rows = np.concatenate([rows, replay_rows(ws, lo, hi)])
        spans += replay_sidecar_lines(ws, lo, hi, last_new - first_row, row_len)
    assert len(rows) == last_row - first_row, (split, j, len(rows), last_row - first_row)
    side = ws.local(sidecar_name(split, j))
    side.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic_path(side)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(spans)
    os.replace(tmp, side)
    mask = document_attention_mask(rows, ids["eos_id"]) if d.packing.document_mask else None
    write_mindrecord(ws.local(rel), rows, attention_mask=mask)
    ws.publish(sidecar_name(split, j), rel + ".db", rel)
    ws.mark(f"mr-{split}-{j:05d}")
    return rel



def write_mindrecord_files(cfg, paths, items: list[tuple[str, int]], *, shared: bool = True) -> list[str]:
    """write_mindrecord_shard for each (split, j) of `items`, in one task (see mindrecord_groups)."""
    return [write_mindrecord_shard(cfg, paths, split, j, shared=shared) for split, j in items]
