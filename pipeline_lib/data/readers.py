"""Stream the records of one shard: jsonl (plain or gzip), parquet and Arrow IPC (.arrow), local or s3://.

Nothing is downloaded whole: plain jsonl shards are byte ranges (a local seek, or an S3 ranged
GET streamed line by line) of the input file or, for a split gzip file, of one of its decompressed
chunks (spec.source), an unsplit gzip file is decompressed as it streams, and parquet is read
row group by row group through a seekable file that fetches only the byte ranges pyarrow asks
for. Records come in batches of `batch_size` as (line number, text or None, reason, raw).

Malformed records are not errors: they come back with a reason (empty_line, bad_utf8, bad_json,
not_an_object, missing_text, text_not_string, empty_text, lone_surrogate, non_finite_number,
line_too_long) for the quarantine file. bad_json includes JSON nested deeper than Python's parser goes;
lone_surrogate is a `\\udXXX` escape without its pair in the text or a carried field (valid JSON, but no
Unicode text: nothing could write it); non_finite_number is a NaN / Infinity literal anywhere in the line
(not JSON) or a number too large for a double (1e999999), or a NaN / inf float in a carried parquet
column: written back it would be `Infinity` or `NaN`, which no JSON reader takes; line_too_long is a jsonl line longer than
`max_line` bytes, read past as it streams (its raw is its first `head` bytes, see storage.iter_lines).
Raises: DataStageError when a parquet file has no column `data.text_field` or a non-string one, or a
.jsonl.gz file is corrupt or truncated.
"""
from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from typing import Iterator

import orjson

from ..storage import LongLine, iter_lines, store_for
from ..storage.input_files import open_arrow, open_parquet
from .errors import DataStageError

Record = tuple  # (line_or_row, text | None, reason | None, raw bytes | str | None, fields dict)


def open_range(uri: str, start: int, end: int | None, endpoint_url: str | None = None):
    """A binary stream of bytes [start, end) of a file (end None: to the end)."""
    return store_for(uri, endpoint_url).open_range(uri, start, end)


_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")  # \ud800-\udfff in a JSON line


def _has_lone_surrogate(text, found: dict) -> bool:
    try:
        if isinstance(text, str):
            text.encode("utf-8")
        json.dumps(found, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _NonFinite(ValueError):
    """A NaN / Infinity literal: Python's json takes them, JSON does not."""


def _refuse_constant(name: str):
    raise _NonFinite(name)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999999: valid JSON syntax, but no double holds it
        raise _NonFinite(literal[:40])
    return value


def _any_float(value, test) -> bool:
    """Whether a decoded JSON / parquet value holds a float for which test(float) is true, at any depth."""
    if isinstance(value, float):
        return test(value)
    if isinstance(value, dict):
        return any(_any_float(v, test) for v in value.values())
    if isinstance(value, list):
        return any(_any_float(v, test) for v in value)
    return False


def _non_finite(value) -> bool:
    """Whether a parquet value holds a float that is not finite (NaN, inf: a float column)."""
    return _any_float(value, lambda f: not math.isfinite(f))


_FAST_MAX_BRACKETS = 512


def _fast_object(raw: bytes, fields: tuple[str, ...]) -> dict | None:
    """orjson's parse of a line (~3x json's speed on Chinese text) when it is certainly what json.loads
    gives, else None (json then decides and names the fault). orjson refuses what json refuses here (bad
    UTF-8, NaN / Infinity, lone surrogates, 1e999999); it differs on big integers (a float, not an int)
    and on depth (it nests to 1024, json to its recursion limit): so only objects whose carried fields
    hold no float, in lines of fewer than _FAST_MAX_BRACKETS brackets."""
    if raw.count(b"[") + raw.count(b"{") >= _FAST_MAX_BRACKETS:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    for f in fields:
        value = obj.get(f)
        if type(value) not in _FLOATLESS and _any_float(value, _always):
            return None
    return obj


_FLOATLESS = {str, int, bool, type(None)}  # a carried field's usual values, decided without a call


def _always(_: float) -> bool:
    return True


def parse_record(raw: bytes, text_field: str, fields: tuple[str, ...] = ()) -> tuple[str | None, str | None, dict]:
    """(text, None, fields) for a good jsonl line, else (None, reason, fields); `fields` holds the
    present, non-null values of the named fields ({} when the line is not a JSON object)."""
    if not raw.strip():
        return None, "empty_line", {}
    obj = _fast_object(raw, fields)
    if obj is None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None, "bad_utf8", {}
        try:
            obj = json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float)
        except _NonFinite:
            return None, "non_finite_number", {}
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return None, "bad_json", {}
    if not isinstance(obj, dict):
        return None, "not_an_object", {}
    found = {f: obj[f] for f in fields if obj.get(f) is not None}
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(obj.get(text_field), found):  # search: a cheap pre-check
        return None, "lone_surrogate", {}
    if text_field not in obj or obj[text_field] is None:
        return None, "missing_text", found
    text = obj[text_field]
    if not isinstance(text, str):
        return None, "text_not_string", found
    return (text, None, found) if text.strip() else (None, "empty_text", found)


def parse_line(raw: bytes, text_field: str) -> tuple[str | None, str | None]:
    """(text, None) for a good jsonl line, else (None, reason)."""
    return parse_record(raw, text_field)[:2]


def _jsonl_records(spec, text_field: str, endpoint_url, fields: tuple[str, ...], max_line: int | None,
                   head: int) -> Iterator[Record]:
    fh = open_range(getattr(spec, "source", None) or spec.uri, spec.start, spec.end, endpoint_url)
    i = 0
    try:
        stream = gzip.GzipFile(fileobj=fh) if spec.kind == "jsonl.gz" else fh
        for i, raw in enumerate(iter_lines(stream, max_line, head)):
            if isinstance(raw, LongLine):
                yield spec.first + i, None, "line_too_long", raw, {}  # raw: its head and size
                continue
            text, reason, found = parse_record(raw, text_field, fields)
            yield spec.first + i, text, reason, (raw if reason else None), found
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:  # a corrupt or truncated .gz: the file, named
        raise DataStageError("data.inputs", spec.uri, f"not a readable gzip file ({err}; read {i} lines)",
                             "re-create the file (`gzip -t FILE` checks one) or remove it from data.inputs") from None
    finally:
        fh.close()


def _plain(value):
    """A parquet value as a JSON value: dates and times as ISO strings, bytes as text, the rest as is."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return value


def _text_column(schema, spec, text_field: str, fields: tuple[str, ...], what: str) -> list[str]:
    """The carried columns present in a columnar file, after checking its text column (named errors)."""
    import pyarrow as pa

    names = schema.names
    if text_field not in names:
        raise DataStageError("data.text_field", text_field, f"{what} file {spec.uri} has no such column "
                             f"(columns: {names})", "set data.text_field to the column holding the text")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataStageError("data.text_field", text_field, f"column is {kind} in {spec.uri}, not a string",
                             "point data.text_field at a string column")
    return [f for f in dict.fromkeys(fields) if f in names and f != text_field]  # columns present only


def _parquet_records(spec, text_field: str, batch_size: int, endpoint_url,
                     fields: tuple[str, ...]) -> Iterator[Record]:
    pf = open_parquet(spec.uri, endpoint_url)
    extra = _text_column(pf.schema_arrow, spec, text_field, fields, "parquet")
    groups = list(range(spec.start, spec.end))
    if not groups:
        return
    batches = pf.iter_batches(batch_size=batch_size, row_groups=groups, columns=[text_field, *extra])
    yield from _column_records(batches, spec.first, text_field, extra)


def _arrow_records(spec, text_field: str, endpoint_url, fields: tuple[str, ...]) -> Iterator[Record]:
    import pyarrow as pa

    try:
        schema, batches = open_arrow(spec.uri, endpoint_url)
    except pa.ArrowInvalid as err:
        raise DataStageError("data.inputs", spec.uri, f"not a readable Arrow IPC file ({err})",
                             "re-create it (Hugging Face: Dataset.save_to_disk) or remove it from data.inputs") from None
    extra = _text_column(schema, spec, text_field, fields, "arrow")
    yield from _column_records(batches, spec.first, text_field, extra)


def _column_records(batches, first: int, text_field: str, extra: list[str]) -> Iterator[Record]:
    row = first
    for batch in batches:
        values = {f: batch.column(f).to_pylist() for f in extra}
        for i, text in enumerate(batch.column(text_field).to_pylist()):
            found = {f: _plain(v[i]) for f, v in values.items() if v[i] is not None}
            if _non_finite(found):
                yield row, None, "non_finite_number", text, {}
            elif text is None:
                yield row, None, "missing_text", None, found
            elif not text.strip():
                yield row, None, "empty_text", text, found
            else:
                yield row, text, None, None, found
            row += 1


def iter_shard_batches(spec, text_field: str, batch_size: int, endpoint_url: str | None = None,
                       fields: tuple[str, ...] = (), max_line: int | None = None,
                       head: int = 1 << 16) -> Iterator[list[Record]]:
    """Batches of at most `batch_size` records of one shard, in file order; `fields`: the names
    whose values each record carries along; max_line / head: a longer jsonl line is line_too_long with
    its first `head` bytes as raw (see the module docstring)."""
    fields = tuple(fields)
    records = (_parquet_records(spec, text_field, batch_size, endpoint_url, fields) if spec.kind == "parquet"
               else _arrow_records(spec, text_field, endpoint_url, fields) if spec.kind == "arrow"
               else _jsonl_records(spec, text_field, endpoint_url, fields, max_line, head))
    batch = []
    for rec in records:
        batch.append(rec)
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch
