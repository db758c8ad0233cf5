"""Steps 1-3 of the data stage: plan the shards, prepare each shard (read, quarantine, clean,
hash, sign, write its keys by dedup partition), deduplicate all shards in input order (the partitions
of dedup_run.py, then their resolution); then (`stage_index_segment`, while the
tokenizer trains) this run's segment of the persistent dedup index, all but its publication.

`prep_shard` drops the documents data.exclude_from / data.exclude_ids name (exclusions.py: the loss guard's, the
nightly screen's) before the filters.

Each step is idempotent: it returns at once when its completion marker (shards/<name>.done,
holding the work hash) exists, so a rerun redoes only unfinished shards and partitions. `prep_shard` and
dedup_run.dedup_partition are the functions mapped over shards and partitions; `plan_data_stage` and
`dedup_stage` run once.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import killpoints
from ..storage import LongLine, join
from .dedup import EXACT, NEAR
from .dedup_index import SegmentWriter, index_uri, lineage, segment_meta, stage_segment
from .dedup_parts import PARTS, PARTS_IDX, partition_count, shard_parts
from .dedup_run import dedup_partition, resolve
from .errors import DataStageError, NoNewDocuments
from .decontaminate import FILTER, REASON, EvalNgrams, build_eval_ngrams, overlap_text
from .exclusions import EXCLUSIONS_FILE, load_exclusions, save_exclusions, saved_exclusions
from .filters import Doc, apply_filters_batch, build_filters
from .index_lease import take_lease
from .minhash import lsh_params, shingle_hashes, signatures
from .readers import iter_shard_batches
from .sources import ShardSpec, list_inputs, plan_shards
from .text import dedup_form_keeping_tokens, key_of_form
from .tokenhash import token_arrays_of_forms
from .tokenizer import lineage_tokenizer_checked
from .tokenizer_sample import write_shard_sample
from .workspace import Workspace, atomic_path


NO_NEW_DOCUMENTS = "no_new_documents.json"  # left by a run whose documents were all seen before
STAGE_OUTPUTS = ("shards", "cleaned", "tokenizer", "mindrecord", "quarantine.jsonl", "excluded.jsonl",
                 "duplicates.jsonl", "stats.json", NO_NEW_DOCUMENTS)


def shard_dir(index: int) -> str:
    return f"shards/{index:05d}"


def read_docs(ws: Workspace, index: int, columns: list[str]) -> pa.Table:
    """Columns of shard `index`'s prepared documents (docs.parquet). pq.ParquetFile, not pq.read_table:
    the same table without importing pyarrow.dataset (~0.2 s of CPU per process)."""
    return pq.ParquetFile(ws.fetch(f"{shard_dir(index)}/docs.parquet")).read(columns=columns)


def plan_data_stage(cfg, paths, *, shared: bool = True) -> list[dict]:
    """List the inputs and split them into shards (shards/plan.json); returns the shard specs."""
    ws = Workspace(cfg, paths, shared)
    if ws.is_marked("plan"):
        return ws.read_json("shards/plan.json")["shards"]
    from .replay import check_replay  # (replay.py reads this module's work files)

    check_replay(cfg, ws.endpoint, lineage_tokenizer_checked(cfg))  # both refused before any record is read
    for rel in STAGE_OUTPUTS:  # a fresh start: nothing of an attempt with another config survives
        ws.remove(rel)
    files = list_inputs(cfg.data.inputs, ws.endpoint, follow_symlinks=cfg.data.follow_symlinks)
    from ..storage import store_for

    # the rerun rule of the dedup index compares input files by content: hashed in threads while the shards are
    # cut (sha256 lets go of the GIL), not in a second pass after it (~1 s a GB of one core)
    with ThreadPoolExecutor(2, thread_name_prefix="fingerprint") as hashing:
        prints = [hashing.submit(store_for(u, ws.endpoint).fingerprint, u) for u, _ in files] if uses_index(cfg) else []
        try:
            shards = [s.to_dict() for s in plan_shards(files, cfg.data.docs_per_shard, ws.endpoint, cfg.data.shard_mb,
                                                       chunks=partial(_gunzip_chunk, ws))]
        except BaseException:
            hashing.shutdown(cancel_futures=True)  # the files not started are not read for nothing
            raise
        sizes = [{"uri": u, "label": lab, "size": store_for(u, ws.endpoint).size(u)} for u, lab in files]
        for f, printed in zip(sizes, prints):
            f["fingerprint"] = printed.result()
    evals, held_out = build_eval_ngrams(cfg, ws.endpoint)  # once per run; every shard worker loads it
    evals.save(ws.local(EVAL_NGRAMS))
    save_exclusions(load_exclusions(cfg, ws.endpoint), ws.local(EXCLUSIONS_FILE))  # the same: read once a run
    ws.publish(EVAL_NGRAMS, EXCLUSIONS_FILE)
    ws.write_json("shards/plan.json", {"files": sizes, "shards": shards,
                                       "decontamination": {"ngram": evals.n, "files": held_out},
                                       "dedup_partitions": partition_count(cfg, len(shards))})
    ws.mark("plan")
    return shards


EVAL_NGRAMS = "shards/eval_ngrams.npz"
_EVALS: dict = {}


def eval_ngrams(ws: Workspace) -> EvalNgrams | None:
    """The run's evaluation windows (written by the plan step), None when there are none; loaded once per process."""
    path = ws.fetch(EVAL_NGRAMS)
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _EVALS:
        _EVALS.clear()
        _EVALS[key] = EvalNgrams.load(path)
    evals = _EVALS[key]
    return evals if len(evals.hashes) else None


def _run_exclusions(cfg, ws: Workspace):
    """The exclusions the plan step read (once a run); a plan written before it saved them reads the files."""
    try:
        path = ws.fetch(EXCLUSIONS_FILE)
    except (OSError, KeyError):
        path = None
    return saved_exclusions(path) if path is not None and path.exists() else load_exclusions(cfg, ws.endpoint)


def _gunzip_chunk(ws: Workspace, n: int):
    """Chunk n of the split gzip inputs (sources.ChunkSink): written locally, then published; shards read
    it where they can reach it (the shared stage folder, or this machine's copy when work stays local)."""
    rel = f"shards/gunzip/{n:05d}.jsonl"

    def publish() -> str:
        ws.publish(rel)
        return ws.uri_of(rel) if ws.remote and not ws.local_work else str(ws.local(rel))

    return ws.local(rel), publish


def uses_index(cfg) -> bool:
    d = cfg.data.dedup
    return d.incremental and (d.exact or d.near)


def _utf8_head(data: bytes, n: int) -> bytes:
    """The first n bytes of data, without a multi-byte UTF-8 character cut in two at the end."""
    data = data[:n]
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last character's first byte: is the character whole?
            whole = back >= (4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1)
            return data if whole else data[:-back]
    return data


def quarantine_copy(raw, limit: int) -> dict:
    """The `raw` of a quarantine record, at most `limit` bytes of it, plus `raw_bytes` (the whole record's
    size) when it was cut; raw is bytes (a jsonl line), str (a parquet value), a LongLine (its head) or None."""
    if raw is None:
        return {"raw": None}
    if isinstance(raw, LongLine):
        return {"raw": _utf8_head(raw.head, limit).decode("utf-8", "backslashreplace"), "raw_bytes": raw.size}
    if isinstance(raw, str):
        if len(raw) <= limit // 4:  # 4 bytes a character at most: short enough without encoding it
            return {"raw": raw}
        data = raw.encode("utf-8", "surrogatepass")
        if len(data) <= limit:
            return {"raw": raw}
    else:
        data = raw
        if len(data) <= limit:
            return {"raw": data.decode("utf-8", "backslashreplace")}
    return {"raw": _utf8_head(data, limit).decode("utf-8", "backslashreplace"), "raw_bytes": len(data)}


def excluded_copy(text: str, limit: int) -> dict:
    """The `text` of an exclusion record, at most `limit` UTF-8 bytes of it, plus `text_chars` (the
    whole text's length) when it was cut."""
    if len(text) <= limit // 4 or len(text.encode("utf-8")) <= limit:
        return {"text": text}
    return {"text": _utf8_head(text[:limit].encode("utf-8"), limit).decode("utf-8"), "text_chars": len(text)}


def record_identity(cfg, label: str, line: int, fields: dict) -> tuple:
    """(source id, origin, meta) of a record: its `data.id_field` value (else its origin),
    `<file label>:<line>`, and its present `data.keep_fields` values."""
    d, origin = cfg.data, f"{label}:{line}"
    meta = {k: fields[k] for k in d.keep_fields if k in fields}
    return fields.get(d.id_field, origin), origin, meta


# one encoder for every call: json.dumps with keyword arguments builds a new JSONEncoder each time
_json = json.JSONEncoder(ensure_ascii=False, default=str).encode


def prep_shard(cfg, paths, index: int, *, shared: bool = True) -> dict:
    """Read shard `index`, quarantine malformed records, run the filters, and write the surviving
    documents (origin, source id, meta, text, exact key) with their MinHash signatures. Returns
    the shard's counts. Documents are keyed internally by their origin (`<file>:<line>`, unique);
    source ids are carried along, never assumed unique."""
    ws, d = Workspace(cfg, paths, shared), cfg.data
    folder = shard_dir(index)
    if ws.is_marked(f"{index:05d}.prep"):
        return ws.read_json(f"{folder}/counts.json")
    spec = ShardSpec(**ws.read_json("shards/plan.json")["shards"][index])
    filters = build_filters(d.filters)
    exclusions = _run_exclusions(cfg, ws)
    fields = (d.id_field, *d.keep_fields)
    rejected, filtered, read = Counter(), Counter(), 0
    # copies written per reason: beyond the cap a record is counted only (finalize_data_stage then keeps
    # the file's first `cap` across its shards); each copy is cut at max_copy_bytes
    cap, copy = d.max_records_written_per_reason, d.max_copy_bytes
    wrote_q, wrote_x = Counter(), Counter()
    origins, source_ids, metas, texts, keys, sigs = [], [], [], [], [], []
    evals = eval_ngrams(ws)
    contaminated: Counter = Counter()  # per evaluation file
    with open(ws.local(f"{folder}/quarantine.jsonl"), "w", encoding="utf-8") as qf, \
            open(ws.local(f"{folder}/excluded.jsonl"), "w", encoding="utf-8") as xf:
        def exclude(origin, line, text, sid, meta, name, reason, extra=None):
            filtered[reason] += 1
            if wrote_x[reason] < cap:
                wrote_x[reason] += 1
                xf.write(_json({"id": sid, "origin": origin, "file": spec.uri, "line": line, "filter": name,
                                "reason": reason, **(extra or {}), "meta": meta, **excluded_copy(text, copy)}) + "\n")

        # positional arguments: tests wrap iter_shard_batches to count the shards read
        for batch in iter_shard_batches(spec, d.text_field, d.read_batch_size, ws.endpoint, fields,
                                        d.max_line_bytes, copy):
            docs, found = [], []
            for line, text, reason, raw, values in batch:
                read += 1
                sid, origin, meta = record_identity(cfg, spec.label, line, values)
                if reason:
                    rejected[reason] += 1
                    if wrote_q[reason] < cap:
                        wrote_q[reason] += 1
                        qf.write(_json({"id": sid, "origin": origin, "file": spec.uri, "line": line,
                                        "reason": reason, **quarantine_copy(raw, copy)}) + "\n")
                elif exclusions and (why := exclusions.reason(sid, origin)):
                    exclude(origin, line, text, sid, meta, why, why)
                else:
                    docs.append(Doc(origin, text))
                    found.append((line, text, sid, meta))
            survivors = []
            for doc, (line, text, sid, meta), dropped in zip(docs, found, apply_filters_batch(docs, filters)):
                if dropped:
                    exclude(doc.id, line, text, sid, meta, dropped[0], dropped[1])
                    continue
                survivors.append((doc, line, text, sid, meta))
            # what dedup compares: NFKC, unlike the training text; mostly with the text's own tokens
            texts_kept = [doc.text for doc, *_ in survivors]
            forms, same = zip(*map(dedup_form_keeping_tokens, texts_kept)) if survivors else ((), ())
            arrays = token_arrays_of_forms(texts_kept, forms, same) if evals is not None or d.dedup.near else None
            overlaps, at = evals.find(arrays, len(forms)) if evals is not None else (None, None)
            for i, (doc, line, text, sid, meta) in enumerate(survivors):
                if overlaps is not None and overlaps[i] >= 0:  # held out means held out: decontaminate.py
                    file = evals.files[overlaps[i]]
                    contaminated[file] += 1
                    exclude(doc.id, line, text, sid, meta, FILTER, REASON,
                            {"overlaps": file, "overlap": overlap_text(forms[i], int(at[i]), evals.n)})
                    continue
                origins.append(doc.id)
                source_ids.append(_json(sid))
                metas.append(_json(meta))
                texts.append(doc.text)
                keys.append(key_of_form(forms[i]))
            if d.dedup.near:
                sig = signatures(*shingle_hashes(forms, d.dedup.ngram, arrays), d.dedup.num_perm)
                sigs.append(sig if overlaps is None or (overlaps < 0).all() else sig[overlaps < 0])
    table = pa.table({"origin": pa.array(origins, pa.string()), "source_id": pa.array(source_ids, pa.string()),
                      "meta": pa.array(metas, pa.string()), "text": pa.array(texts, pa.string()),
                      "key": pa.array(np.asarray(keys, dtype=np.uint64), pa.uint64())})
    pq.write_table(table, ws.local(f"{folder}/docs.parquet"), compression="zstd")
    write_shard_sample(ws, cfg, index, texts, keys)  # this shard's share of the tokenizer's training sample
    names = ["quarantine.jsonl", "excluded.jsonl", "docs.parquet"]
    sig_all = None
    if d.dedup.near:
        sig_all = np.concatenate(sigs) if sigs else np.zeros((0, d.dedup.num_perm), np.uint32)
        np.save(ws.local(f"{folder}/sigs.npy"), sig_all)
        names.append("sigs.npy")
    if d.dedup.exact or d.dedup.near:  # this shard's keys by dedup partition (dedup_parts.py)
        parts, offsets = shard_parts(table.column("key").to_numpy(), sig_all, d.dedup, dedup_partitions(ws))
        np.save(ws.local(f"{folder}/{PARTS}"), parts)
        np.save(ws.local(f"{folder}/{PARTS_IDX}"), offsets)
        names += [PARTS, PARTS_IDX]
    ws.publish(*[f"{folder}/{n}" for n in names])
    counts = {"label": spec.label, "uri": spec.uri, "read": read, "rejected": dict(rejected),
              "filtered": dict(filtered), "candidates": len(origins),
              **({"contaminated_by": dict(contaminated)} if contaminated else {}),
              "written": {"quarantine.jsonl": dict(wrote_q), "excluded.jsonl": dict(wrote_x)}}
    ws.write_json(f"{folder}/counts.json", counts)
    ws.mark(f"{index:05d}.prep")
    killpoints.reached("data.prep.between_shards")
    return counts


def dedup_partitions(ws: Workspace) -> int:
    """The plan's number of dedup partitions (a plan from before partitions: 1)."""
    return ws.read_json("shards/plan.json").get("dedup_partitions", 1)


def dedup_stage(cfg, paths, progress=None, *, shared: bool = True) -> dict:
    """Decide exact and near duplicates over all shards in input order (first seen wins), against
    the persistent index of earlier runs too; writes duplicates.jsonl and shards/<k>/keep.npy.
    The partitions (dedup_run.dedup_partition: a task each, mapped like prep_shard) run here first
    when they have not run yet; this step then resolves what they found (dedup_run.resolve), with
    memory for the candidate pairs, exact copies and index hits, not for the corpus.
    Returns the summary (per-shard counts, LSH bands x rows)."""
    ws, d = Workspace(cfg, paths, shared), cfg.data.dedup
    if ws.is_marked("dedup"):
        return ws.read_json("shards/dedup.json")
    plan = ws.read_json("shards/plan.json")
    n_shards, n_parts = len(plan["shards"]), dedup_partitions(ws)
    bands, rows = lsh_params(d.threshold, d.num_perm)
    if uses_index(cfg):
        take_lease(index_uri(cfg), paths.run_id, ws.endpoint)  # `dedup-index clear` refuses until finalize drops it
    if d.exact or d.near:
        for p in range(n_parts):  # those no mapped task did
            dedup_partition(cfg, paths, p, shared=shared)
        prior, decided = resolve(cfg, paths, ws, n_shards, n_parts, shard_dir, read_docs)
    else:
        prior, decided = None, ((np.zeros(c["candidates"], np.int8), []) for c in
                                (ws.read_json(f"{shard_dir(k)}/counts.json") for k in range(n_shards)))
    per_shard, from_earlier = [], 0
    out_path = ws.local("duplicates.jsonl")
    tmp = atomic_path(out_path)
    with open(tmp, "w", encoding="utf-8") as out:
        for k, (decisions, records) in enumerate(decided):
            folder = shard_dir(k)
            for rec in records:
                out.write(_json(rec) + "\n")
                from_earlier += rec["kept_run"] is not None
            np.save(ws.local(f"{folder}/keep.npy"), decisions)
            ws.publish(f"{folder}/keep.npy")
            per_shard.append({"exact_duplicates": int((decisions == EXACT).sum()),
                              "near_duplicates": int((decisions == NEAR).sum()), "kept": int((decisions == 0).sum())})
            if progress:
                progress("dedup", k + 1, n_shards)
    os.replace(tmp, out_path)
    ws.publish("duplicates.jsonl")
    if sum(s["kept"] for s in per_shard) == 0:
        _nothing_kept(cfg, ws, n_shards, per_shard, from_earlier, prior)
    summary = {"shards": per_shard, "bands": bands, "rows": rows,
               "prior_docs": len(prior) if prior is not None else 0,
               "prior_runs": prior.runs if prior is not None else [],
               "rerun_of": prior.reruns if prior is not None else []}
    ws.write_json("shards/dedup.json", summary)
    ws.mark("dedup")
    return summary


SEGMENT = "shards/segment"


def stage_index_segment(cfg, paths, *, shared: bool = True) -> list[str]:
    """This run's segment of the persistent dedup index (its kept documents' origins, exact keys,
    signatures and source ids, in input order, as the dedup decisions left them), written to
    shards/segment/, and its entries merged into the index partitions (dedup_index.stage_segment;
    every reader ignores them until finalize_data_stage publishes the segment itself).
    It needs no tokenizer: the stage runs it while the tokenizer trains. Returns the segment's file
    names ([] without an incremental index)."""
    ws = Workspace(cfg, paths, shared)
    if ws.is_marked("segment"):
        return ws.read_json(f"{SEGMENT}.json")["names"]
    names = []
    if uses_index(cfg):  # shard by shard: no process holds the run's kept signatures, origins, source ids
        d, plan = cfg.data.dedup, ws.read_json("shards/plan.json")
        n = sum(s["kept"] for s in ws.read_json("shards/dedup.json")["shards"])
        out = SegmentWriter(ws.local(SEGMENT), n, d.num_perm if d.near else None)
        for k in range(len(plan["shards"])):
            folder = shard_dir(k)
            keep = np.load(ws.fetch(f"{folder}/keep.npy")) == 0
            table = read_docs(ws, k, ["origin", "source_id", "key"]).filter(pa.array(keep))
            # str objects through numpy: about half the time of to_pylist
            out.add(table.column("origin").to_numpy(zero_copy_only=False), table.column("key").to_numpy(),
                    np.load(ws.fetch(f"{folder}/sigs.npy"), mmap_mode="r")[keep] if d.near else None,
                    table.column("source_id").to_numpy(zero_copy_only=False))  # JSON text
        names = out.close(segment_meta(cfg, paths.run_id, n, d.near, plan["files"]))
        ws.publish(*[f"{SEGMENT}/{n}" for n in names])
        stage_segment(ws.local(SEGMENT), names, index_uri(cfg), paths.run_id, ws.endpoint)
    ws.write_json(f"{SEGMENT}.json", {"names": names})
    ws.mark("segment")
    return names


def _nothing_kept(cfg, ws: Workspace, n_shards: int, per_shard: list[dict], from_earlier: int, prior) -> None:
    """Fail the dedup step, saying why no document is left, and leave NO_NEW_DOCUMENTS in the stage folder
    when the cause is the data rather than the config (the nightly reads it, consumes the files and trains
    nothing): every document seen by earlier runs of the lineage (`kind` all_seen), or every record rejected
    or filtered (`kind` no_usable_documents: a file of garbage is not retried every night). Only when no record
    has the text field at all is it the config (data.text_field): a plain failure, nothing consumed."""
    counts = [ws.read_json(f"{shard_dir(k)}/counts.json") for k in range(n_shards)]
    read, candidates = sum(c["read"] for c in counts), sum(c["candidates"] for c in counts)
    if from_earlier == 0:
        _nothing_usable(cfg, ws, counts, read)
    uri = index_uri(cfg)
    found = {"kind": "all_seen", "read": read, "candidates": candidates, "duplicates_of_earlier_runs": from_earlier,
             "duplicates_within_run": candidates - from_earlier, "kept": 0, "lineage": lineage(cfg),
             "index_uri": uri, "earlier_runs": prior.runs if prior is not None else []}
    ws.write_json(NO_NEW_DOCUMENTS, found)
    raise NoNewDocuments(
        "data.dedup.lineage", lineage(cfg),
        f"no new document: every one of the {candidates} documents that survived cleaning (of {read} read) was "
        f"seen before, {from_earlier} in earlier runs of this lineage ({', '.join(found['earlier_runs'])}), "
        f"{candidates - from_earlier} earlier in this run; the dedup index is at {uri}",
        "nothing is wrong if these are old documents. To train on them anyway: a fresh lineage "
        "(data.dedup.lineage=NEW_NAME), or data.dedup.incremental=false, or clear this lineage's index "
        f"(llm-pipeline dedup-index list|clear CONFIG --lineage {lineage(cfg)})", found)


def unusable_reasons(found: dict) -> str:
    """"3 bad_json, 1 empty_text": the reasons of a no_usable_documents count, most frequent first."""
    return ", ".join(f"{n} {r}" for r, n in (Counter(found["rejected"]) + Counter(found["filtered"])).most_common())


def _nothing_usable(cfg, ws: Workspace, counts: list[dict], read: int) -> None:
    rejected, filtered = Counter(), Counter()
    for c in counts:
        rejected.update(c["rejected"])
        filtered.update(c["filtered"])
    files = {name: [join(ws.uri, shard_dir(k), name) for k, c in enumerate(counts) if c["written"][name]]
             for name in ("quarantine.jsonl", "excluded.jsonl")}
    reasons = unusable_reasons({"rejected": rejected, "filtered": filtered})
    where = "; ".join(f"{name}: {', '.join(uris)}" for name, uris in files.items() if uris) or "none written"
    if read and set(rejected) == {"missing_text"} and not filtered:
        raise DataStageError("data.text_field", cfg.data.text_field, f"none of the {read} records read from "
                             f"{list(cfg.data.inputs)} has this field (records: {where})",
                             "set data.text_field to the field that holds your records' text")
    found = {"kind": "no_usable_documents", "read": read, "candidates": 0, "kept": 0,
             "rejected": dict(rejected), "filtered": dict(filtered), "records": files}
    ws.write_json(NO_NEW_DOCUMENTS, found)
    raise NoNewDocuments(
        "data.inputs", list(cfg.data.inputs), f"no usable document: all {read} records read were rejected or "
        f"filtered ({reasons or 'nothing read'}); the records and their reasons: {where}",
        "nothing to train on in these files. If the data is good and a setting dropped it (data.filters, "
        "data.text_field), fix the setting and give the files again under new names", found)
