"""The persistent dedup index of a lineage: what its earlier runs kept, so tonight's data is
deduplicated against it, without loading it into memory.

Layout at `data.dedup.index_uri` (default <output_root>/_dedup_index/<lineage>, the lineage being
data.dedup.lineage or run.name):
  index.json                   the index's own metadata: format, prefix_bits (partitions per kind
                               = 2^prefix_bits), num_perm, ngram, threshold and its LSH bands x rows
  segments/<run_id>/           one run's row store: keys.npy (uint64 exact keys of the kept documents),
                               sigs.npy (uint32 (n, num_perm) MinHash signatures; absent when near
                               dedup was off), ids.jsonl (origins `<file>:<line>`, one JSON string
                               a line: a file name may hold any character, a newline too),
                               source_ids.jsonl (data.id_field values), *.idx (byte offset of each
                               line; lines end at "\n" only), and
                               meta.json, written last (a run without it is ignored everywhere):
                               the run's input files (uri, size, content fingerprint)
  parts/exact/b<bits>/p<prefix>/g<generation>.bin         exact-key entries, sorted (index_partitions)
  parts/near-<b>x<r>/b<bits>/p<prefix>/g<generation>.bin  LSH band-key entries for b bands x r rows
About 8 + 4 x num_perm bytes per document in the row store plus 21 x (1 + bands) in partitions.

The dedup step (`load_prior`) groups this run's keys by partition, streams each partition file
block by block, keeps the hits and fetches only the hit documents' rows (ranged reads): memory
depends on this run, not on the index (bench/dedup_index.md). A commit (`commit_segment`) merges
the run's entries into each partition as one conditional write (storage.generations: a new
generation created only if absent; on conflict re-read, merge, retry), so two runs committing at
once lose nothing. The data stage does it in two steps: `stage_segment` (the partition entries)
while the tokenizer trains, `publish_segment` (row store, meta.json last) once the whole stage
succeeded; with data.dedup.defer_publish (the nightly) the stage keeps the segment in <run>/data/segment/ and
the nightly publishes it when the night is promoted (a held night's never is, so its documents are not "seen
before" when they are carried to the next night; staged entries are copied by repartition like the others). Readers ignore entries whose run has no segment, so a failed run is never deduplicated
against (its entries stay as dead weight in the partitions until its resume replaces them or the
index is cleared), and a run never reads its own entries (a resumed run is not deduplicated against itself).
The rerun rule: a run skips the runs whose input files (uri, size, fingerprint) are all among its
own inputs: that run read the same data, it is a rerun, not data seen before (so running a config
twice gives the same dataset twice, while new files are checked against everything).

Limits: the band keys of one LSH layout (threshold -> bands x rows) are stored; a run whose
threshold gives another layout is refused (naming data.dedup.threshold). Indexes written by earlier
versions (segments only) are refused with the fix: `llm-pipeline dedup-index migrate` converts them
in place. prefix_bits is set when the index is created (16 partitions per kind) and grows with
`llm-pipeline dedup-index repartition --bits N` (files are streamed, so their size costs commit
time, not lookup memory). Every commit rewrites each partition it touches (a night touches all):
commit I/O grows with the index. A segment written with another num_perm, shingle size or
shingle version cannot be compared and is refused.
Raises: DataStageError naming data.dedup.* when parameters differ, or data.dedup.index_uri when a
commit keeps losing to concurrent writers (storage.generations.CommitConflict).
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from .. import killpoints
from ..storage import generations, join, store_for
from ..storage.names import name_key
from .errors import DataStageError
from .index_partitions import ENTRY, entries, iter_blocks, lookup, merge, prefix_of, run_tag
from .minhash import EMPTY, SCHEME, SEED, SHINGLE_VERSION, band_keys, lsh_params

# 1: segments only, loaded whole; 2: + partitions, origins as plain lines in ids.txt (a newline in a file name split
# one origin in two and shifted every later row); 3: origins as JSON strings in ids.jsonl (any file name survives)
FORMAT = 3
IDS_FILE = "ids.jsonl"
DEFAULT_PREFIX_BITS = 4  # 16 exact + 16 band partitions; index.json keeps the value of each index
CAP = 64                 # prior candidates per (band, key), as PriorIndex.candidates


def lineage(cfg) -> str:
    """data.dedup.lineage, or run.name as a key no other name shares (storage.names.name_key: an ASCII name as it
    is, so its index is found where it always was; `电力语料` and `医疗语料` both were `____`)."""
    return cfg.data.dedup.lineage or name_key(cfg.run.name)


def index_uri(cfg) -> str:
    return cfg.data.dedup.index_uri or join(cfg.run.output_root, "_dedup_index", lineage(cfg))


def segment_meta(cfg, run_id: str, n: int, has_sigs: bool, inputs: list[dict] | None = None) -> dict:
    """inputs: the run's input files [{uri, size, fingerprint}] (the rerun rule compares them)."""
    d = cfg.data.dedup
    bands, rows = lsh_params(d.threshold, d.num_perm)
    return {"run_id": run_id, "lineage": lineage(cfg), "docs": n, "num_perm": d.num_perm, "ngram": d.ngram,
            "seed": SEED, "scheme": SCHEME, "shingle_version": SHINGLE_VERSION, "has_sigs": has_sigs,
            "inputs": inputs or [], "format": FORMAT, "threshold": d.threshold, "bands": bands, "rows": rows}


def _file_ids(inputs) -> set[tuple]:
    return {(f["uri"], f["size"], f.get("fingerprint")) for f in inputs or []}


def is_rerun_of(meta: dict, inputs: list[dict] | None) -> bool:
    """True when every input file of the segment's run (same uri, size, fingerprint) is an input of
    this run too: this run rereads that data, so it is not deduplicated against that run."""
    theirs = _file_ids(meta.get("inputs"))
    return bool(theirs) and all(f[2] for f in theirs) and theirs <= _file_ids(inputs)


def _prior_segments(segments: list[dict], exclude_run: str, inputs: list[dict] | None) -> tuple[list[dict], list[str]]:
    """(the segments a run deduplicates against: all but `exclude_run`'s and those it reruns, in the
    given order; the run ids it reruns)."""
    prior, reruns = [], []
    for meta in segments:
        if meta["run_id"] == exclude_run:
            continue
        if is_rerun_of(meta, inputs):
            reruns.append(meta["run_id"])
        else:
            prior.append(meta)
    return prior, reruns


def list_segments(cfg, endpoint_url: str | None = None) -> list[dict]:
    """The meta.json of every committed segment of the lineage's index, in commit-name order."""
    uri = index_uri(cfg)
    return list_segments_at(store_for(uri, endpoint_url), uri)


def list_segments_at(store, uri: str) -> list[dict]:
    metas = sorted(u for u in store.list(join(uri, "segments") + "/") if u.endswith("/meta.json"))
    return [json.loads(store.get_bytes(m)) | {"uri": m.rsplit("/", 1)[0]} for m in metas]


INDEX_ENTRIES = ("index.json", "segments", "parts", "leases")  # everything an index folder holds at its top


def clear_index(cfg, endpoint_url: str | None = None) -> int:
    """Delete the lineage's whole index; returns how many segments it held. Only a folder that is an index is
    removed: it has index.json or segments/<run>/meta.json, and nothing at its top but INDEX_ENTRIES (a typo such
    as data.dedup.index_uri=. must not remove a working directory). Raises DataStageError otherwise."""
    uri = index_uri(cfg)
    store = store_for(uri, endpoint_url)
    files = store.list(uri.rstrip("/") + "/")
    if not files:
        return 0
    prefix = uri.rstrip("/") + "/"
    tops = sorted({f[len(prefix):].split("/", 1)[0] for f in files if f.startswith(prefix)})
    strangers = [t for t in tops if t not in INDEX_ENTRIES]
    segments = list_segments(cfg, endpoint_url)
    if strangers or not ("index.json" in tops or segments):
        shown = ", ".join(strangers[:5]) or "no index.json and no segments/<run>/meta.json"
        raise DataStageError("data.dedup.index_uri", uri, f"is not a dedup index folder ({shown}); nothing was "
                             "deleted", "point data.dedup.index_uri at the index itself (default "
                             "<output_root>/_dedup_index/<lineage>), or delete the folder by hand if you mean it")
    from .index_lease import refuse_while_used

    refuse_while_used(uri, lineage(cfg), endpoint_url)  # a run reading it would fail mid-dedup
    store.delete(uri)
    return len(segments)


def _lines(text: str) -> list[str]:
    """The lines of a text whose every line ends with "\n" (str.splitlines would also cut at \x85, \u2028, ...:
    characters a JSON text written with ensure_ascii=False may hold)."""
    return text.split("\n")[:-1] if text else []


def encode_origin(origin: str) -> str:
    """One origin as its line of ids.jsonl: a JSON string, ASCII only, so a name with a newline, a line separator
    or a byte that is not UTF-8 (a lone surrogate escape of the file system's name) comes back as it was.
    json.dumps(origin, ensure_ascii=True) by the function it calls for a str, without its per-call dispatch."""
    return _ascii_json_string(origin)


_ascii_json_string = json.encoder.encode_basestring_ascii


def decode_origin(line: str) -> str:
    return json.loads(line)


def _line_offsets(lines_text: str) -> np.ndarray:
    """Byte offsets (n + 1, uint64) of the lines of a text: row r is bytes [off[r], off[r+1])."""
    lengths = [len(x.encode("utf-8")) + 1 for x in _lines(lines_text)]
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.uint64)]).astype("<u8")


def write_segment(folder: Path, meta: dict, ids: list[str], keys: np.ndarray, sigs: np.ndarray | None,
                  source_ids: list | None = None, *, source_json: list[str] | None = None) -> list[str]:
    """Write a segment (one run's row store) into a local folder; returns the file names, meta.json last.
    source_json: the source ids already as JSON text (json.dumps(s, ensure_ascii=False, default=str)),
    instead of source_ids. ids.idx / source_ids.idx hold the byte offset of every line, so a reader
    fetches a few rows with ranged reads instead of reading the whole file."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "keys.npy", np.asarray(keys, dtype=np.uint64))
    names = ["keys.npy"]
    texts = {"ids": "".join(encode_origin(i) + "\n" for i in ids)}
    if source_ids is not None:
        source_json = [json.dumps(s, ensure_ascii=False, default=str) for s in source_ids]
    if source_json is not None:
        texts["source_ids"] = "".join(s + "\n" for s in source_json)
    for stem, text in texts.items():
        ext = ".jsonl"
        (folder / f"{stem}{ext}").write_text(text, encoding="utf-8")
        (folder / f"{stem}.idx").write_bytes(_line_offsets(text).tobytes())
        names += [f"{stem}{ext}", f"{stem}.idx"]
    if sigs is not None:
        np.save(folder / "sigs.npy", np.asarray(sigs, dtype=np.uint32))
        names.append("sigs.npy")
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return names + ["meta.json"]


class SegmentWriter:
    """write_segment a part at a time (the same files, byte for byte): the dedup step's kept documents shard by
    shard, so no process holds the run's signatures, origins or source ids at once. `n` (the row count) is known
    beforehand: keys.npy and sigs.npy get their header first and their rows appended (not memory maps: every
    written page of a map stays in the writer's RSS, 1.5 GB of signatures at 100x the benchmark corpus)."""

    def __init__(self, folder: Path, n: int, num_perm: int | None, with_sources: bool = True):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.n, self.at, self.has_sigs = folder, n, 0, num_perm is not None
        self.keys = _npy_appender(folder / "keys.npy", np.uint64, (n,))
        self.sigs = _npy_appender(folder / "sigs.npy", np.uint32, (n, num_perm)) if num_perm is not None else None
        self.stems = ["ids", "source_ids"] if with_sources else ["ids"]
        self.text = {s: open(folder / f"{s}.jsonl", "wb") for s in self.stems}
        self.idx = {s: open(folder / f"{s}.idx", "wb") for s in self.stems}
        self.offset = dict.fromkeys(self.stems, 0)
        for s in self.stems:
            self.idx[s].write(np.zeros(1, "<u8").tobytes())

    def _lines(self, stem: str, lines: list[str]) -> None:
        data = [(x + "\n").encode("utf-8") for x in lines]
        self.text[stem].write(b"".join(data))
        ends = self.offset[stem] + np.cumsum([len(x) for x in data], dtype=np.uint64)
        self.idx[stem].write(ends.astype("<u8").tobytes())
        if len(data):
            self.offset[stem] = int(ends[-1])

    def add(self, ids: list[str], keys: np.ndarray, sigs: np.ndarray | None, source_json: list[str] | None) -> None:
        n = len(ids)
        self.keys.write(np.ascontiguousarray(keys, "<u8").tobytes())
        if self.sigs is not None:
            self.sigs.write(np.ascontiguousarray(sigs, "<u4").tobytes())
        self._lines("ids", [encode_origin(i) for i in ids])
        if "source_ids" in self.stems:
            self._lines("source_ids", source_json)
        self.at += n

    def close(self, meta: dict) -> list[str]:
        """Flush, write meta.json (last); returns the file names as write_segment does."""
        assert self.at == self.n, (self.at, self.n)
        for fh in (self.keys, self.sigs, *self.text.values(), *self.idx.values()):
            if fh is not None:
                fh.close()
        (self.folder / "meta.json").write_text(json.dumps(meta, indent=1))
        names = ["keys.npy"] + [f"{s}{ext}" for s in self.stems for ext in (".jsonl", ".idx")]
        return names + (["sigs.npy"] if self.has_sigs else []) + ["meta.json"]


def _npy_appender(path: Path, dtype, shape: tuple):
    """A .npy file opened for its rows to be appended, its header (np.save's, format 1.0) written."""
    fh = open(path, "wb")
    np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                              "fortran_order": False, "shape": shape})
    return fh


def _npy_head(fh) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of the .npy file `fh`, left at its first row."""
    version = np.lib.format.read_magic(fh)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(fh)
    return shape, dtype


def _npy_len(path: Path) -> int:
    with open(path, "rb") as fh:
        return _npy_head(fh)[0][0]


def _npy_slice(path: Path, a: int, b: int) -> np.ndarray:
    """Rows [a, b) of a local .npy file, read, not memory-mapped (mapped pages stay in the reader's RSS)."""
    with open(path, "rb") as fh:
        shape, dtype = _npy_head(fh)
        width = int(np.prod(shape[1:], dtype=np.int64))
        b = min(b, shape[0])
        fh.seek(a * width * dtype.itemsize, 1)
        return np.fromfile(fh, dtype, max(0, b - a) * width).reshape(-1, *shape[1:])


def _index_params(meta: dict) -> dict:
    return {"format": FORMAT, "prefix_bits": DEFAULT_PREFIX_BITS,
            **{k: meta[k] for k in ("num_perm", "ngram", "seed", "scheme", "shingle_version", "bands", "rows",
                                    "threshold")}}


def _read_index_json(store, uri: str) -> dict | None:
    path = join(uri, "index.json")
    return json.loads(store.get_bytes(path)) if store.exists(path) else None


def _ensure_index_json(store, uri: str, meta: dict) -> dict:
    """The index's own metadata (format, partition prefix bits, MinHash/LSH parameters); the first
    commit creates it (create-if-absent: two first commits agree on one)."""
    store.put_new(join(uri, "index.json"), json.dumps(_index_params(meta), indent=1).encode())
    params = _read_index_json(store, uri)
    for field in ("num_perm", "ngram"):
        if params[field] != meta[field]:
            raise DataStageError(f"data.dedup.{field}", meta[field], f"the index at {uri} was built with "
                                 f"{field}={params[field]}", f"set data.dedup.{field}={params[field]}, or "
                                 "data.dedup.index_uri to a new index")
    if meta.get("has_sigs") and (params["bands"], params["rows"]) != (meta["bands"], meta["rows"]):
        raise _layout_error(uri, params, meta["threshold"], meta["bands"], meta["rows"])
    return params


def _layout_error(uri: str, params: dict, threshold: float, bands: int, rows: int) -> DataStageError:
    return DataStageError("data.dedup.threshold", threshold, f"the index at {uri} holds LSH band keys for "
                          f"{params['bands']} bands x {params['rows']} rows (threshold {params['threshold']}); "
                          f"this threshold gives {bands} x {rows}",
                          f"set data.dedup.threshold={params['threshold']}, or data.dedup.index_uri to a new "
                          "index, or clear this one (llm-pipeline dedup-index clear CONFIG)")


def _old_format_error(uri: str, meta: dict) -> DataStageError:
    what = ("origins as plain lines: a file name with a newline shifts them" if meta.get("format") == 2 else
            "whole segments loaded into memory, no partitions")
    return DataStageError("data.dedup.index_uri", uri, f"the index holds run {meta['run_id']} in the format of "
                          f"an earlier llm-pipeline version ({what})",
                          "convert it in place, keeping every document: llm-pipeline dedup-index migrate CONFIG "
                          "(or start over: llm-pipeline dedup-index clear CONFIG)")


def _partition_folder(uri: str, kind: str, bits: int, prefix: int) -> str:
    return join(uri, "parts", kind, f"b{bits:02d}", f"p{prefix:04x}")


def _run_entries(keys: np.ndarray, sigs: np.ndarray | None, bands: int, rows: int, tag: np.uint64):
    """(exact entries, band entries) of one run's kept documents (EMPTY signatures: no band entries)."""
    n = len(keys)
    exact = entries(np.asarray(keys, np.uint64), np.zeros(n, np.uint8), tag, np.arange(n, dtype=np.uint32))
    if sigs is None or not n:
        return exact, np.zeros(0, ENTRY)
    near = []
    for a in range(0, n, 1 << 16):  # band keys a chunk at a time
        chunk = np.asarray(sigs[a:a + (1 << 16)])
        live = np.flatnonzero(~(chunk == EMPTY).all(axis=1))
        bk = band_keys(chunk[live], bands, rows)
        near.append(entries(bk.ravel(), np.tile(np.arange(bands, dtype=np.uint8), len(live)), tag,
                            np.repeat((live + a).astype(np.uint32), bands)))
    return exact, np.concatenate(near)


def commit_segment(folder: Path, names: list[str], uri: str, run_id: str, endpoint_url: str | None = None, *,
                   after_read=None, migrating: bool = False) -> str:
    """Add a local segment to the index: stage_segment, then publish_segment. Idempotent: a retried
    commit replaces its own entries. Returns the segment's folder in the index."""
    stage_segment(folder, names, uri, run_id, endpoint_url, after_read=after_read, migrating=migrating)
    return publish_segment(folder, names, uri, run_id, endpoint_url)


def publish_segment(folder: Path, names: list[str], uri: str, run_id: str, endpoint_url: str | None = None) -> str:
    """The staged segment's row store under segments/<run_id>/, meta.json last: from then on readers
    see the run. Returns that folder."""
    store, target = store_for(uri, endpoint_url), join(uri, "segments", run_id)
    for name in [n for n in names if n != "meta.json"] + ["meta.json"]:
        store.put_file(Path(folder) / name, join(target, name))
    return target


def stage_segment(folder: Path, names: list[str], uri: str, run_id: str, endpoint_url: str | None = None, *,
                  after_read=None, migrating: bool = False) -> None:
    """A commit's expensive part: the segment's exact and band keys merged into the partitions (one
    conditional write per partition, re-read and merged again when another run committed in
    between). Readers ignore the entries of a run without a segment: until publish_segment, the
    run leaves no trace anyone sees. Idempotent: a retry replaces the run's own entries.
    Raises CommitConflict (storage.generations) when a partition kept losing to other writers."""
    store = store_for(uri, endpoint_url)
    meta = json.loads((Path(folder) / "meta.json").read_text())
    params = _ensure_index_json(store, uri, meta)
    if not migrating:
        old = [m for m in list_segments_at(store, uri) if m.get("format") != FORMAT]
        if old:
            raise _old_format_error(uri, old[0])
    tag = run_tag(run_id)
    sigs = Path(folder) / "sigs.npy" if "sigs.npy" in names else None
    keys = Path(folder) / "keys.npy"
    while True:  # until the partition count did not change (repartition_index) while we wrote
        bits = params["prefix_bits"]
        spilled = _spill_entries(Path(folder) / ".entries", keys, sigs, params["bands"], params["rows"], tag, bits)
        for kind in ("exact", f"near-{params['bands']}x{params['rows']}"):
            for path in spilled[kind]:  # one partition's entries in memory at a time
                _merge_into_partitions(store, uri, kind, bits, np.fromfile(path, ENTRY), tag, run_id, after_read)
                path.unlink()
        params = _read_index_json(store, uri)
        if params["prefix_bits"] == bits:
            break


def _spill_entries(folder: Path, keys: Path, sigs: Path | None, bands: int, rows: int, tag: np.uint64,
                   bits: int) -> dict[str, list[Path]]:
    """The run's exact and band entries (_run_entries), computed a chunk of documents at a time and appended to
    one local file per kind and partition prefix (in document order, as _run_entries gives them); the files by
    kind, in prefix order. The commit then holds one partition's entries at a time, not the run's."""
    folder.mkdir(parents=True, exist_ok=True)
    near_kind = f"near-{bands}x{rows}"
    files: dict[str, dict[int, Path]] = {"exact": {}, near_kind: {}}
    for old in folder.glob("*.bin"):
        old.unlink()
    chunk = 1 << 16
    for a in range(0, _npy_len(keys), chunk):
        exact, near = _run_entries(_npy_slice(keys, a, a + chunk),
                                   None if sigs is None else _npy_slice(sigs, a, a + chunk), bands, rows, tag)
        exact["row"] += np.uint32(a)
        near["row"] += np.uint32(a)
        for kind, adds in (("exact", exact), (near_kind, near)):
            prefixes = prefix_of(adds["key"], bits)
            order = np.argsort(prefixes, kind="stable")
            adds, prefixes = adds[order], prefixes[order]
            present, starts = np.unique(prefixes, return_index=True)  # sorted: each prefix is one slice
            for p, a, z in zip(present, starts, [*starts[1:], len(prefixes)]):
                path = files[kind].setdefault(int(p), folder / f"{kind}-{int(p):04x}.bin")
                with open(path, "ab") as fh:
                    fh.write(adds[a:z].tobytes())
    return {kind: [by[p] for p in sorted(by)] for kind, by in files.items()}


def _merge_into_partitions(store, uri: str, kind: str, bits: int, adds: np.ndarray, drop, run_id: str,
                           after_read=None) -> None:
    """One conditional write per partition that `adds` touches (drop: the run tags replaced)."""
    prefixes = prefix_of(adds["key"], bits)
    for p in np.unique(prefixes):
        mine = adds[prefixes == p]
        try:
            generations.update(store, _partition_folder(uri, kind, bits, int(p)),
                               lambda cur, out, mine=mine: merge(store, cur, mine, out, drop), suffix=".bin",
                               after_read=after_read)
        except generations.CommitConflict as err:
            raise DataStageError("data.dedup.index_uri", uri, f"run {run_id}'s documents could not be added "
                                 f"to the index: {err}", "run the stage again once the other run has "
                                 "committed: the commit is idempotent and nothing else is redone") from err
        killpoints.reached("data.dedup_index.mid_commit")


def repartition_index(cfg, bits: int, endpoint_url: str | None = None) -> int:
    """Grow the index to 2^bits partitions per kind (more, smaller files: cheaper commits and
    retries; lookups stream either way). Copies every partition into its children (a sorted file
    splits into contiguous key ranges), switches index.json, then copies again the partitions a
    commit changed meanwhile (a commit that wrote the old layout after the switch redoes its
    merges in the new one itself). A dedup step running during the switch may miss the runs
    committed during it; run it between nights. The old layout's files stay (`clear` removes
    them with the index). Returns the previous prefix_bits."""
    uri = index_uri(cfg)
    store = store_for(uri, endpoint_url)
    params = _read_index_json(store, uri)
    if params is None:
        raise DataStageError("data.dedup.index_uri", uri, "there is no index to repartition", "nothing to do")
    old = params["prefix_bits"]
    if not old < bits <= 16:
        raise DataStageError("dedup-index repartition --bits", bits, f"the index has prefix_bits={old}; it can only "
                             "grow, to at most 16", f"pass --bits between {old + 1} and 16")
    kinds = ["exact", f"near-{params['bands']}x{params['rows']}"]
    copied = {(k, p): _split_partition(store, uri, k, old, bits, p) for k in kinds for p in range(2 ** old)}
    store.put_bytes(join(uri, "index.json"), json.dumps(params | {"prefix_bits": bits}, indent=1).encode())
    for (kind, p), gen in copied.items():  # commits that landed in the old layout before the switch
        while generations.latest(store, _partition_folder(uri, kind, old, p))[0] != gen:
            gen = _split_partition(store, uri, kind, old, bits, p)
    return old


def _split_partition(store, uri: str, kind: str, old: int, bits: int, p: int) -> int:
    """Copy partition p of the `old` layout into its children of the `bits` layout (each child's
    entries of the partition's runs are replaced, so copying again is harmless); returns the
    generation copied. Holds one old partition in memory (a maintenance step, not the dedup step)."""
    gen, current = generations.latest(store, _partition_folder(uri, kind, old, p))
    whole = np.concatenate(list(iter_blocks(store, current)) or [np.zeros(0, ENTRY)])
    child = prefix_of(whole["key"], bits)
    for c in np.unique(child):
        data = whole[child == c]
        generations.update(store, _partition_folder(uri, kind, bits, int(c)),
                           lambda cur, out, data=data: merge(store, cur, data, out, np.unique(data["run"])),
                           suffix=".bin")
    return gen


class PriorIndex:
    """The loaded segments of earlier runs: exact-key and LSH-band lookups, vectorized."""

    def __init__(self, ids: list[str], keys: np.ndarray, sigs: np.ndarray, bands: int, rows: int, runs: list[str],
                 source_ids: list | None = None):
        """ids: `<run>/<origin>` per row; source_ids: the kept documents' source ids (default: the origins)."""
        self.ids, self.sigs, self.runs, self.reruns = ids, sigs, runs, []
        self.docs = len(ids)  # documents in the index it stands for (load_prior: more than the rows held)
        self.source_ids = source_ids if source_ids is not None else [i.split("/", 1)[1] for i in ids]
        self.key_order = np.argsort(keys, kind="stable")
        self.sorted_keys = keys[self.key_order]
        has = ~(sigs == np.uint32(0xFFFFFFFF)).all(axis=1) if len(sigs) else np.zeros(0, bool)
        self.near_rows = np.flatnonzero(has)
        bk = band_keys(sigs[self.near_rows], bands, rows) if len(self.near_rows) else np.zeros((0, bands), np.uint64)
        self.band_order = [np.argsort(bk[:, b], kind="stable") for b in range(bands)]
        self.band_sorted = [bk[o, b] for b, o in enumerate(self.band_order)]

    def __len__(self) -> int:
        return self.docs

    def exact(self, keys: np.ndarray) -> np.ndarray:
        """Row of the first earlier document with each key, or -1."""
        pos = np.searchsorted(self.sorted_keys, keys)
        pos = np.minimum(pos, max(len(self.sorted_keys) - 1, 0))
        hit = (self.sorted_keys[pos] == keys) if len(self.sorted_keys) else np.zeros(len(keys), bool)
        return np.where(hit, self.key_order[pos] if len(self.key_order) else -1, -1)

    def candidates(self, qkeys: np.ndarray, cap: int = 64) -> list[np.ndarray]:
        """Per query row (band keys), the earlier rows sharing at least one band (at most `cap` per band)."""
        out: list[list[np.ndarray]] = [[] for _ in range(len(qkeys))]
        for b, (order, keys) in enumerate(zip(self.band_order, self.band_sorted)):
            lo, hi = np.searchsorted(keys, qkeys[:, b], "left"), np.searchsorted(keys, qkeys[:, b], "right")
            for q in np.flatnonzero(hi > lo):
                out[q].append(self.near_rows[order[lo[q]:min(hi[q], lo[q] + cap)]])
        return [np.unique(np.concatenate(c)) if c else np.zeros(0, np.int64) for c in out]


def load_prior_in_memory(cfg, exclude_run: str, bands: int, rows: int, endpoint_url: str | None = None,
               inputs: list[dict] | None = None) -> PriorIndex:
    """Every committed segment of the index except `exclude_run`'s and those this run reruns
    (is_rerun_of: listed in `.reruns`), in commit-name order, loaded whole: the reference that
    load_prior's partitioned lookups are tested against (and the bench's "in memory" column)."""
    uri, d = index_uri(cfg), cfg.data.dedup
    store = store_for(uri, endpoint_url)
    ids: list[str] = []
    keys, sigs, runs, sources = [], [], [], []
    prior_metas, reruns = _prior_segments(list_segments(cfg, endpoint_url), exclude_run, inputs)
    for meta in prior_metas:
        if meta.get("format") != FORMAT:
            raise _old_format_error(uri, meta)
        _check_params(meta, uri, d)
        base = meta["uri"]
        keys.append(np.load(io.BytesIO(store.get_bytes(join(base, "keys.npy")))))
        n = len(keys[-1])
        sigs.append(np.load(io.BytesIO(store.get_bytes(join(base, "sigs.npy")))) if meta["has_sigs"]
                    else np.full((n, d.num_perm), 0xFFFFFFFF, dtype=np.uint32))
        run_ids = [decode_origin(x) for x in _lines(store.get_bytes(join(base, IDS_FILE)).decode("utf-8"))]
        ids += [f"{meta['run_id']}/{i}" for i in run_ids]
        if store.exists(join(base, "source_ids.jsonl")):
            text = store.get_bytes(join(base, "source_ids.jsonl")).decode("utf-8")
            sources += [json.loads(x) for x in _lines(text)]
        else:  # a segment from before source ids were kept
            sources += run_ids
        runs.append(meta["run_id"])
    prior = PriorIndex(ids, np.concatenate(keys) if keys else np.zeros(0, np.uint64),
                       np.concatenate(sigs) if sigs else np.zeros((0, d.num_perm), np.uint32), bands, rows, runs,
                       sources)
    prior.reruns = reruns
    return prior


def _check_params(meta: dict, uri: str, d) -> None:
    """The segment was built with this config's MinHash parameters and shingle/hash version."""
    for field, mine in (("num_perm", d.num_perm), ("ngram", d.ngram)):
        if meta[field] != mine:
            raise DataStageError(f"data.dedup.{field}", mine, f"the index at {uri} was built with "
                                 f"{field}={meta[field]} (run {meta['run_id']})",
                                 f"set data.dedup.{field}={meta[field]}, or data.dedup.index_uri to a new index")
    if meta["shingle_version"] != SHINGLE_VERSION or meta["seed"] != SEED or meta["scheme"] != SCHEME:
        raise DataStageError("data.dedup.index_uri", uri, f"segment {meta['run_id']} uses another shingle/hash "
                             "version", "start a new index (set data.dedup.index_uri)")


def _groups(rows: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """Sorted rows as [first, last] ranges, rows less than `gap` apart in one range (one ranged read)."""
    if not len(rows):
        return []
    cut = np.flatnonzero(np.diff(rows) > gap) + 1
    return [(int(g[0]), int(g[-1])) for g in np.split(rows, cut)]


def _npy_rows(store, uri: str, rows: np.ndarray) -> np.ndarray:
    """Rows of a .npy array on the store, by ranged reads (the file is never read whole)."""
    with store.open_range(uri, 0, 4096) as fh:
        head = io.BytesIO(fh.read())
    shape, dtype = _npy_head(head)
    start, width = head.tell(), int(np.prod(shape[1:], dtype=np.int64))
    row_bytes = dtype.itemsize * width
    out = np.empty((len(rows), *shape[1:]), dtype)
    for a, b in _groups(rows, max(1, (64 << 10) // row_bytes)):
        with store.open_range(uri, start + a * row_bytes, start + (b + 1) * row_bytes) as fh:
            block = np.frombuffer(fh.read(), dtype).reshape(-1, *shape[1:])
        sel = (rows >= a) & (rows <= b)
        out[sel] = block[rows[sel] - a]
    return out


def _line_rows(store, text_uri: str, idx_uri: str, rows: np.ndarray) -> list[str]:
    """Lines `rows` of a text file on the store, located by its .idx offsets (ranged reads)."""
    out: list[str] = [""] * len(rows)
    for a, b in _groups(rows, 256):
        with store.open_range(idx_uri, a * 8, (b + 2) * 8) as fh:
            offs = np.frombuffer(fh.read(), "<u8").astype(np.int64)
        with store.open_range(text_uri, int(offs[0]), int(offs[-1])) as fh:
            text = fh.read()
        for i in np.flatnonzero((rows >= a) & (rows <= b)):
            r = int(rows[i]) - a
            out[i] = text[offs[r] - offs[0]:offs[r + 1] - offs[0] - 1].decode("utf-8")
    return out


def _first_per_group(hits: np.ndarray, order: np.ndarray, cap: int) -> np.ndarray:
    """The hits that are among the first `cap` (in index order) of their (key, band)."""
    if not len(hits):
        return hits
    sort = np.lexsort((hits["row"], order, hits["band"], hits["key"]))
    h = hits[sort]
    new = np.ones(len(h), bool)
    new[1:] = (h["key"][1:] != h["key"][:-1]) | (h["band"][1:] != h["band"][:-1])
    starts = np.maximum.accumulate(np.where(new, np.arange(len(h)), 0))
    return h[np.arange(len(h)) - starts < cap]


def _lookup_partitions(store, uri: str, kind: str, qkeys: np.ndarray, qbands: np.ndarray, bits: int,
                       tags: np.ndarray) -> np.ndarray:
    """Matching entries of every partition of `kind`, one partition file streamed at a time
    (the queries of a partition are built as records only while it is read)."""
    found = []
    prefixes = prefix_of(qkeys, bits).astype(np.int32)
    for p in np.unique(prefixes):
        mine = prefixes == p
        queries = entries(qkeys[mine], qbands[mine], 0, np.zeros(int(mine.sum()), np.uint32))
        folder = _partition_folder(uri, kind, bits, int(p))
        for attempt in range(3):  # the generation read can be pruned by a committer meanwhile
            try:
                found.append(lookup(store, generations.latest(store, folder)[1], queries, tags))
                break
            except Exception as err:
                if attempt == 2 or not (isinstance(err, FileNotFoundError) or "NoSuchKey" in str(err)):
                    raise
    return np.concatenate(found) if found else np.zeros(0, ENTRY)


def load_prior(cfg, exclude_run: str, bands: int, rows: int, endpoint_url: str | None = None,
               inputs: list[dict] | None = None, keys: np.ndarray | None = None,
               band_keys_: np.ndarray | None = None) -> PriorIndex:
    """What this run's documents need from the earlier runs of the index (every committed run but
    `exclude_run` and those this run reruns, listed in `.reruns`), without loading the index:
    keys: this run's exact keys (None: no exact lookups); band_keys_: its (n, bands) LSH band keys
    (None: no near lookups). The new keys are grouped by partition and each partition file is
    streamed and released; the prior documents they hit (per key the earliest, per band key the
    first CAP, in commit-name order) are fetched by ranged reads into a small PriorIndex. Its
    decisions equal load_prior_in_memory's; len() is the number of documents in the index.
    The partitioned dedup step does the same in two halves: prior_hits per partition of its own
    keys (a key's hits all fall in its partition), prior_rows once over what they wanted."""
    seen = PriorRuns(cfg, exclude_run, endpoint_url, inputs)
    qkeys = qbands = None
    if band_keys_ is not None:
        qkeys = np.asarray(band_keys_, np.uint64).ravel()
        qbands = np.tile(np.arange(bands, dtype=np.uint8), len(band_keys_))
    return seen.index(seen.hits(bands, rows, keys, qkeys, qbands)[0], bands, rows)


class PriorRuns:
    """The earlier runs a run deduplicates against (see load_prior): their listing and checks, then
    `hits` (index entries wanted by some keys) and `index` (the PriorIndex of the wanted rows)."""

    def __init__(self, cfg, exclude_run: str, endpoint_url: str | None = None, inputs: list[dict] | None = None):
        self.cfg, self.uri, d = cfg, index_uri(cfg), cfg.data.dedup
        self.store = store_for(self.uri, endpoint_url)
        segments = list_segments_at(self.store, self.uri)
        for meta in segments:
            if meta.get("format") != FORMAT:  # refused here, not at the commit after the whole stage ran
                raise _old_format_error(self.uri, meta)
        prior_metas, self.reruns = _prior_segments(segments, exclude_run, inputs)
        for meta in prior_metas:
            _check_params(meta, self.uri, d)
        self.runs, self.metas = [m["run_id"] for m in prior_metas], {m["run_id"]: m for m in prior_metas}
        self.params = _read_index_json(self.store, self.uri) if self.runs else None
        if self.runs and self.params is None:
            raise DataStageError("data.dedup.index_uri", self.uri, "the index has runs but no index.json (its "
                                 "metadata was deleted or not copied)", "copy the whole index folder, or clear it "
                                 "(llm-pipeline dedup-index clear CONFIG)")

    def hits(self, bands: int, rows: int, keys: np.ndarray | None, qkeys: np.ndarray | None = None,
             qbands: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """((n, 2) int64 (run order, row) of the index rows wanted by exact `keys` (the earliest per key) and
        by band keys `qkeys` of bands `qbands` (the first CAP per band key), unique, sorted; the keys that hit)."""
        params, store, uri, d = self.params, self.store, self.uri, self.cfg.data.dedup
        hits = []
        if params and keys is not None and len(keys):
            hits.append((1, _lookup_partitions(store, uri, "exact", np.asarray(keys, np.uint64),
                                               np.zeros(len(keys), np.uint8), params["prefix_bits"],
                                               np.array([run_tag(r) for r in self.runs], np.uint64))))
        if params and qkeys is not None and len(qkeys):
            if (params["bands"], params["rows"]) != (bands, rows):
                raise _layout_error(uri, params, d.threshold, bands, rows)
            near = _lookup_partitions(store, uri, f"near-{bands}x{rows}", qkeys, qbands, params["prefix_bits"],
                                      np.array([run_tag(r) for r in self.runs if self.metas[r]["has_sigs"]],
                                               np.uint64))
            hits.append((CAP, near))
        order_of = {run_tag(r): i for i, r in enumerate(self.runs)}
        wanted = [np.zeros((0, 2), np.int64)]
        for cap, h in hits:  # exact: the earliest document per key; near: the first CAP per band key
            order = np.array([order_of[t] for t in h["run"]], np.int64)
            kept = _first_per_group(h, order, cap)
            wanted.append(np.stack([np.array([order_of[t] for t in kept["run"]], np.int64),
                                    kept["row"].astype(np.int64)], axis=1))
        found = [h["key"] for _, h in hits]
        return (np.unique(np.concatenate(wanted), axis=0),
                np.unique(np.concatenate(found)) if found else np.zeros(0, np.uint64))

    def index(self, wanted: np.ndarray, bands: int, rows: int) -> PriorIndex:
        """The PriorIndex of the wanted (run order, row) pairs, fetched by ranged reads."""
        store, d = self.store, self.cfg.data.dedup
        ids, sources, key_parts, sig_parts = [], [], [], []
        for i, run in enumerate(self.runs):
            rows_ = np.unique(wanted[wanted[:, 0] == i, 1]) if len(wanted) else np.zeros(0, np.int64)
            if not len(rows_):
                continue
            base, meta = self.metas[run]["uri"], self.metas[run]
            origins = [decode_origin(x) for x in _line_rows(store, join(base, IDS_FILE), join(base, "ids.idx"), rows_)]
            ids += [f"{run}/{o}" for o in origins]
            if store.exists(join(base, "source_ids.idx")):
                sources += [json.loads(x) for x in _line_rows(store, join(base, "source_ids.jsonl"),
                                                              join(base, "source_ids.idx"), rows_)]
            else:
                sources += origins
            key_parts.append(_npy_rows(store, join(base, "keys.npy"), rows_))
            sig_parts.append(_npy_rows(store, join(base, "sigs.npy"), rows_) if meta["has_sigs"]
                             else np.full((len(rows_), d.num_perm), EMPTY, np.uint32))
        prior = PriorIndex(ids, np.concatenate(key_parts) if key_parts else np.zeros(0, np.uint64),
                           np.concatenate(sig_parts) if sig_parts else np.zeros((0, d.num_perm), np.uint32),
                           bands, rows, self.runs, sources)
        prior.reruns = self.reruns
        prior.docs = sum(self.metas[r]["docs"] for r in self.runs)
        return prior


def migrate_index(cfg, endpoint_url: str | None = None) -> list[str]:
    """Convert an index written by an earlier version in place: every old segment (format 1: segments
    only; 2: origins as plain lines) gets its origins as JSON strings (ids.jsonl), its line offsets and
    its keys merged into the partitions (again, for format 2: a commit replaces its own entries), then
    its meta.json says FORMAT; its ids.txt is removed. Returns the run ids converted. Idempotent (a
    migration that stopped halfway can be run again). An origin an earlier version already split at a
    newline of its file name stays split: the plain lines cannot tell."""
    import tempfile

    uri = index_uri(cfg)
    store = store_for(uri, endpoint_url)
    done = []
    for meta in list_segments_at(store, uri):
        if meta.get("format") == FORMAT:
            continue
        with tempfile.TemporaryDirectory(prefix="migrate-") as tmp:
            folder, base = Path(tmp), meta.pop("uri")
            has_sources = store.exists(join(base, "source_ids.jsonl"))
            ids = _lines(store.get_bytes(join(base, "ids.txt")).decode("utf-8"))
            sources = [json.loads(x) for x in _lines(store.get_bytes(join(base, "source_ids.jsonl")).decode("utf-8"))
                       ] if has_sources else None
            keys = np.load(io.BytesIO(store.get_bytes(join(base, "keys.npy"))))
            sigs = np.load(io.BytesIO(store.get_bytes(join(base, "sigs.npy")))) if meta["has_sigs"] else None
            d = cfg.data.dedup
            bands, rows = lsh_params(d.threshold, d.num_perm)
            meta |= {"format": FORMAT, "threshold": d.threshold, "bands": bands, "rows": rows}
            names = write_segment(folder, meta, ids, keys, sigs, sources)
            target = commit_segment(folder, names, uri, meta["run_id"], endpoint_url, migrating=True)
            if store.exists(join(target, "ids.txt")):
                store.delete(join(target, "ids.txt"))
        done.append(meta["run_id"])
    return done
