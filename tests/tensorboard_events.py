"""Scalars read back from TensorBoard event files (the TFRecord framing tensorboardX writes: uint64 length, uint32
masked crc, the serialized `Event`, uint32 masked crc), with tensorboardX's own Event protobuf."""
from __future__ import annotations

import struct
from pathlib import Path


def event_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).rglob("events.out.tfevents.*"))


def read_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar in every event file under `folder` (a later file wins a step)."""
    # MindSpore first: its generated *_pb2 modules fail to import ("Descriptors cannot be created directly") in a
    # process where tensorboardX's protobuf was imported before it (measured: a test file reading events before
    # any MindSpore import broke every later MindSpore import of that pytest worker)
    import mindspore  # noqa: F401
    from tensorboardX.proto import event_pb2

    out: dict[str, dict[int, float]] = {}
    for path in event_files(folder):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            body = data[pos + 12:pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event()
            event.ParseFromString(body)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out
