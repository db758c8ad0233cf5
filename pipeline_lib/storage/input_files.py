"""Input files by kind: which files a config's input entries name, and opening parquet.

- `list_inputs(entries, field=...)`: files, folders, s3:// prefixes (read as folders) and globs, local
  or s3:// (`*`, `?`, `[...]` within one path segment, `**` any depth), all listed by
  store.list_matching; kept are files ending .jsonl, .json (one JSON object per line), .jsonl.gz,
  .json.gz, .parquet or .arrow (`kind_of`; Arrow IPC, what Hugging Face `save_to_disk` writes: its folder's
  metadata, state.json / dataset_info.json / dataset_dict.json beside the .arrow files, is not input), in config
  order and sorted within each entry, without repeats.
  Symbolic links met inside folders and globs are skipped unless `follow_symlinks` (data.follow_symlinks;
  LocalStore.glob), and a link loop is listed once.
  Relative local paths start at the working directory (the config resolves its paths to absolute
  ones when it is built: config/paths.py). Used by the data stage (data.inputs), SFT (sft.inputs),
  config validation and the nightly job (`find_inputs`: an entry matching nothing is not an error).
- File labels, used in record origins (`<label>:<line>`), are the basenames, or the shortest
  unique path suffix when two inputs share a basename.
- `open_parquet(uri)`: a pyarrow ParquetFile over a seekable file that fetches only the byte ranges
  pyarrow asks for (nothing is downloaded whole).
Raises: NoInputFiles (a ValueError naming `field`[i], the entry and the fix) when an entry matches no
supported file.
"""
from __future__ import annotations

from .store import list_matching, store_for
from .errors import PicklableError


class NoInputFiles(PicklableError, ValueError):
    """An input entry matches no supported file: the user must fix the path (not worth a retry)."""

    def __init__(self, field: str, value: object, problem: str, fix: str):
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".jsonl.gz": "jsonl.gz", ".json.gz": "jsonl.gz",
            ".parquet": "parquet", ".arrow": "arrow"}
# what a Hugging Face `save_to_disk` folder holds beside its .arrow files (Dataset and DatasetDict): not records
HF_METADATA = frozenset({"state.json", "dataset_info.json", "dataset_dict.json"})


def kind_of(uri: str) -> str | None:
    name = uri.rsplit("/", 1)[-1].lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return SUFFIXES[suffix]
    return None


def _expand(entry: str, endpoint_url: str | None, follow_symlinks: bool) -> list[str]:
    found = [u for u in list_matching(entry, endpoint_url, follow_symlinks) if kind_of(u)]
    arrow_dirs = {u.rsplit("/", 1)[0] for u in found if kind_of(u) == "arrow"}
    return [u for u in found if not (u.rsplit("/", 1)[-1] in HF_METADATA and u.rsplit("/", 1)[0] in arrow_dirs)]


def find_inputs(inputs: list[str], endpoint_url: str | None = None, follow_symlinks: bool = False) -> list[list[str]]:
    """Per entry of `inputs`, the supported files it matches (possibly none)."""
    return [_expand(entry, endpoint_url, follow_symlinks) for entry in inputs]


def _labels(uris: list[str]) -> list[str]:
    parts = [u.replace("s3://", "").replace("\\", "/").split("/") for u in uris]
    depth = [1] * len(uris)
    while True:
        labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clash = {lab for lab in labels if labels.count(lab) > 1}
        if not clash:
            return labels
        depth = [d + 1 if lab in clash and d < len(p) else d for p, d, lab in zip(parts, depth, labels)]
        if all(lab not in clash or d >= len(p) for p, d, lab in zip(parts, depth, labels)):
            return ["/".join(p) for p in parts]


def list_inputs(inputs: list[str], endpoint_url: str | None = None,
                field: str = "data.inputs", follow_symlinks: bool = False) -> list[tuple[str, str]]:
    """[(uri, label)] of every input file, in config order, without repeats; errors name `field`[i]."""
    uris: list[str] = []
    for i, (entry, found) in enumerate(zip(inputs, find_inputs(inputs, endpoint_url, follow_symlinks))):
        if not found:
            raise NoInputFiles(f"{field}[{i}]", entry, "matches no .jsonl, .jsonl.gz, .parquet or .arrow file",
                               "check the path or glob (relative paths start at the working directory) "
                               "or the s3:// prefix or glob (s3://bucket/prefix/, s3://bucket/prefix/*.jsonl.gz)")
        uris += [u for u in found if u not in uris]
    return list(zip(uris, _labels(uris)))


def open_parquet(uri: str, endpoint_url: str | None = None):
    """A pyarrow ParquetFile reading `uri` through the store (ranged reads on s3://)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(store_for(uri, endpoint_url).open_seekable(uri))


def open_arrow(uri: str, endpoint_url: str | None = None):
    """A pyarrow reader of an Arrow IPC file's record batches: the stream format (Hugging Face `save_to_disk`,
    read as it streams) or the file format (Feather v2, `ARROW1` magic: read through ranged reads)."""
    import pyarrow as pa

    store = store_for(uri, endpoint_url)
    fh = store.open_seekable(uri)
    if fh.read(6) == b"ARROW1":
        fh.seek(0)
        reader = pa.ipc.open_file(fh)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    fh.seek(0)
    reader = pa.ipc.open_stream(fh)
    return reader.schema, iter(reader)
