"""A MindSpore .ckpt file's tensors read without MindSpore: what checkpoint verification needs (names, shapes,
finiteness, the step counters) from a memory map, with no MindSpore import and no copy of the weights.

The format, as MindSpore 2.7 writes and reads it (mindspore/train/checkpoint_pb2.py, serialization.py
`_write_parameter_data`, `_parse_ckpt_proto`, `_load_ckpt_into_param_dict`):
- the file is a protobuf `Checkpoint { repeated Value value = 1 }`, `Value { string tag = 1; TensorProto tensor = 2;
  MapTensorProto maptensor = 3 }`, `TensorProto { repeated int64 dims = 1; string tensor_type = 2;
  bytes tensor_content = 3 }`;
- a tensor above 512 KiB is written as consecutive Values of the same tag, every one with the full dims, whose
  contents concatenate; `dims == [0]` is a scalar; `tensor_type: "str"` holds a string (append_info);
- saved with crc_check, the file ends in b"crc_num" and 10 bytes of CRC, which the reader cuts off.

`scan(path)` returns None for what it does not read (a map tensor, an encrypted file, an unknown tensor type,
anything that does not parse): the caller then asks MindSpore, whose load stays the authority.
Why: verifying a checkpoint in a MindSpore process costs its import (~1.5 s on CPU, more on a loaded host) and
the whole file in memory (a 7B rank shard with AdamW moments: tens of GB); this reads it in place.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DTYPES = {"Int8": np.int8, "UInt8": np.uint8, "Int16": np.int16, "UInt16": np.uint16, "Int32": np.int32,
          "UInt32": np.uint32, "Int64": np.int64, "UInt64": np.uint64, "Float16": np.float16,
          "Float32": np.float32, "Float64": np.float64, "Bool": np.bool_, "BFloat16": np.uint16}
CRC_MARK = b"crc_num"
CHUNK_ELEMENTS = 1 << 24  # the finiteness check's temporary stays at 16 MB whatever the tensor


class Unreadable(ValueError):
    """The file is not one this reader understands (the caller defers to MindSpore)."""


@dataclass
class Tensor:
    dtype: str
    dims: tuple[int, ...]
    nbytes: int = 0
    finite: bool = True
    first: int | None = None  # the first element of an integer tensor (the step counters)
    records: list[tuple[int, int]] = field(default_factory=list)  # its top-level records' bytes in the file


@dataclass
class Scan:
    tensors: dict[str, Tensor] = field(default_factory=dict)

    @property
    def nonfinite(self) -> list[str]:
        return [name for name, t in self.tensors.items() if not t.finite]

    def counter(self, name: str) -> int | None:
        t = self.tensors.get(name)
        return None if t is None else t.first


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise Unreadable("bad varint")


def _fields(buf, pos: int, end: int, starts: list[int] | None = None):
    """(field number, wire type, value or (start, stop) of a length-delimited field) of one message; `starts`
    collects where each field's key begins (a top-level record is starts[i] .. its stop)."""
    while pos < end:
        if starts is not None:
            starts.append(pos)
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise Unreadable("a field runs past its message")
            yield number, wire, (pos, pos + length)
            pos += length
        else:  # checkpoint.proto has no fixed-width fields
            raise Unreadable(f"wire type {wire}")
    if pos != end:
        raise Unreadable("a message runs past its end")


def _tensor(buf, start: int, stop: int) -> tuple[list[int], str, tuple[int, int]]:
    dims, dtype, content = [], None, (start, start)
    for number, wire, value in _fields(buf, start, stop):
        if number == 1 and wire == 0:
            dims.append(value)
        elif number == 1 and wire == 2:  # packed
            pos, end = value
            while pos < end:
                dim, pos = _varint(buf, pos, end)
                dims.append(dim)
        elif number == 2 and wire == 2:
            dtype = bytes(buf[value[0]:value[1]]).decode("utf-8")
        elif number == 3 and wire == 2:
            content = value
        else:
            raise Unreadable(f"TensorProto field {number}")
    if dtype is None:
        raise Unreadable("a tensor without tensor_type")
    return dims, dtype, content


def _finite(buf, dtype: str, start: int, stop: int) -> bool:
    if dtype not in ("Float16", "Float32", "Float64", "BFloat16"):
        return True
    np_type = np.dtype(DTYPES[dtype])
    count = (stop - start) // np_type.itemsize
    for first in range(0, count, CHUNK_ELEMENTS):
        n = min(CHUNK_ELEMENTS, count - first)
        values = np.frombuffer(buf, np_type, n, start + first * np_type.itemsize)
        # bfloat16 is the top half of a float32: all exponent bits set is an inf or a NaN
        bad = ((values & 0x7F80) == 0x7F80).any() if dtype == "BFloat16" else not np.isfinite(values).all()
        if bad:
            return False
    return True


def _scan(buf, end: int) -> Scan:
    out, starts = Scan(), []
    for number, wire, value in _fields(buf, 0, end, starts):
        if (number, wire) != (1, 2):
            raise Unreadable(f"Checkpoint field {number}")
        start, stop = value
        tag = tensor = None
        for vnumber, vwire, value in _fields(buf, start, stop):
            if (vnumber, vwire) == (1, 2):
                tag = bytes(buf[value[0]:value[1]]).decode("utf-8")
            elif (vnumber, vwire) == (2, 2):
                tensor = value
            else:  # 3: a map tensor
                raise Unreadable(f"Value field {vnumber}")
        if tag is None or tensor is None or tensor[0] == tensor[1]:
            raise Unreadable("a value without tag or tensor")
        dims, dtype, (c0, c1) = _tensor(buf, *tensor)
        if dtype != "str" and dtype not in DTYPES:
            raise Unreadable(f"tensor type {dtype}")
        t = out.tensors.get(tag)
        if t is None:
            t = out.tensors[tag] = Tensor(dtype, tuple(dims))
            if dtype in DTYPES and np.issubdtype(DTYPES[dtype], np.integer) and dtype != "BFloat16" and c1 > c0:
                t.first = int(np.frombuffer(buf, DTYPES[dtype], 1, c0)[0])
        elif (t.dtype, t.dims) != (dtype, tuple(dims)):
            raise Unreadable(f"slices of {tag} disagree")
        t.nbytes += c1 - c0
        t.records.append((starts[-1], stop))
        t.finite = t.finite and _finite(buf, dtype, c0, c1)
    for tag, t in out.tensors.items():
        if t.dtype == "str":
            continue
        elements = int(np.prod([d for d in t.dims if t.dims != (0,)], dtype=np.int64))
        if t.nbytes != elements * np.dtype(DTYPES[t.dtype]).itemsize:
            raise Unreadable(f"{tag}: {t.nbytes} bytes for dims {t.dims} of {t.dtype}")
    if not out.tensors:
        raise Unreadable("no tensors")
    return out


def copy_records(src: str | Path, dst, tags: list[str], found: Scan) -> None:
    """Write the records of `tags` (as `found` scanned them from `src`) to the open binary file `dst`, in file
    order: concatenated records of a repeated field are themselves a Checkpoint message, the bytes MindSpore's
    save_checkpoint writes for those tensors."""
    ranges = sorted(r for tag in tags for r in found.tensors[tag].records)
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for start, stop in ranges:
            for pos in range(start, stop, 1 << 26):
                dst.write(buf[pos:min(stop, pos + (1 << 26))])


def scan(path: str | Path) -> Scan | None:
    """The tensors of the checkpoint at `path`, or None when this reader does not understand the file."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            end = len(buf)
            if end >= 17 and buf[end - 17:end - 10] == CRC_MARK:
                end -= 17
            return _scan(buf, end)
    except (Unreadable, ValueError, OSError, BufferError):  # UnicodeDecodeError is a ValueError
        return None
