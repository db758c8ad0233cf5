"""Ascend readings: device memory after launch and MFU, for comparing a real run with the planner.

- `parse_npu_smi(text)`: the device table of `npu-smi info` (one NpuReading per NPU: name, health, AICore %,
  HBM used / total MB). The format is the one npu-smi 25.2.0 prints on a 910B4-1 host, as posted in
  Project-HAMi/HAMi-WebUI issue #47 (docs/planner.md, "Ascend readings"): each NPU is two table rows,
  `| NPU Name | Health | Power(W) Temp(C) Hugepages-Usage(page) |` then
  `| Chip | Bus-Id | AICore(%) Memory-Usage(MB) HBM-Usage(MB) |`, "used / total" pairs. Older cards without an
  HBM column report Memory-Usage only: that pair is taken then.
- `npu_smi_peak_bytes(text, device_ids)`: the largest HBM use among the run's devices, in bytes (1 MB = 2**20).
- `ms_peak_bytes(stats)`: MindSpore's own figure, `mindspore.runtime.memory_stats()['max_reserved_memory']` (the
  pool's high-water mark, what max_device_memory bounds); `device_memory_stats()` reads it in the trainer (Ascend
  only: on CPU MindSpore returns an empty dict).
- `PEAK_TFLOPS` / `peak_tflops(name)`: dense 16-bit peak per device with its source. Only figures published by Huawei
  are listed; a card not in the table gets no MFU unless training.peak_tflops says its peak (published MFU figures
  are often wrong by several times because of a wrong peak: we would rather print none).
- `mfu(...)`: model FLOPs utilisation = model training FLOPs per step (6 x matmul params + attention scores per
  token, no recompute: planner.cost.train_flops_per_token) / (step time x devices x peak).
Graded "needs Ascend": tested here on recorded outputs only (tests/planner/fixtures/).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MB = 2 ** 20  # npu-smi's MB are mebibytes (65536 MB = a 64 GB card)

# name prefix (as npu-smi prints it) -> (TFLOP/s dense fp16, source)
PEAK_TFLOPS: dict[str, tuple[float, str]] = {
    "910A": (256.0, "Huawei, Ascend 910 launch (2019-08-23) and Hot Chips 31: 256 TFLOPS FP16, 32 Da Vinci cores"),
    "910": (256.0, "Huawei, Ascend 910 launch (2019-08-23) and Hot Chips 31: 256 TFLOPS FP16, 32 Da Vinci cores"),
}


@dataclass(frozen=True)
class NpuReading:
    npu: int
    name: str
    health: str
    chip: int
    aicore_pct: float
    hbm_used_mb: int
    hbm_total_mb: int


_ROW1 = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*(\S+)\s*\|")
_ROW2 = re.compile(r"^\|\s*(\d+)\s*\|\s*\S+\s*\|\s*([\d.]+)\s+(.*)\|\s*$")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")


def parse_npu_smi(text: str) -> list[NpuReading]:
    """The NPUs of an `npu-smi info` table; [] when the text holds none (raises nothing: readings are advice)."""
    out, head, hbm = [], None, False
    for line in text.splitlines():
        if "Process id" in line or "Process name" in line:
            break  # the per-process table that follows has rows of another shape
        if "HBM-Usage" in line:
            hbm = True
        m1 = _ROW1.match(line)
        if head is None and m1 and not line.lstrip("| ").startswith(("NPU", "Chip")):
            head = m1
            continue
        m2 = _ROW2.match(line) if head is not None else None
        if m2:
            pairs = _PAIR.findall(m2.group(3))
            if pairs:
                used, total = pairs[-1] if hbm else pairs[0]
                out.append(NpuReading(int(head.group(1)), head.group(2), head.group(3), int(m2.group(1)),
                                      float(m2.group(2)), int(used), int(total)))
        head = None if m2 else head
    return out


def npu_smi_peak_bytes(text: str, device_ids: list[int] | None = None) -> int | None:
    readings = [r for r in parse_npu_smi(text) if device_ids is None or r.npu in device_ids]
    return max((r.hbm_used_mb for r in readings), default=0) * MB or None


def ms_peak_bytes(stats: dict | None) -> int | None:
    value = (stats or {}).get("max_reserved_memory")
    return int(value) if value else None


def device_memory_stats() -> dict:
    """mindspore.runtime.memory_stats() in the trainer; {} when MindSpore has none (CPU) or the call fails."""
    try:
        import mindspore

        return dict(mindspore.runtime.memory_stats() or {})
    except Exception:  # a reading must never stop training
        return {}


def peak_tflops(name: str | None, explicit: float | None = None) -> tuple[float | None, str]:
    """(peak TFLOP/s, source) for a device name as npu-smi prints it; training.peak_tflops wins."""
    if explicit is not None:
        return explicit, "training.peak_tflops"
    for prefix, (value, source) in PEAK_TFLOPS.items():
        if name and (name == prefix or name.startswith(prefix) and not name[len(prefix):len(prefix) + 1].isalpha()):
            return value, source
    return None, (f"no published peak for {name!r} in planner.readings.PEAK_TFLOPS: set training.peak_tflops"
                  if name else "device name unknown: set training.peak_tflops")


def mfu(flops_per_token: float, tokens_per_step: int, step_s: float, devices: int, peak: float) -> float:
    """Model FLOPs utilisation in [0, 1]: the model's training FLOPs per step over what the devices could do."""
    return flops_per_token * tokens_per_step / (step_s * devices * peak * 1e12)


def local_npu_name(timeout_s: float = 10.0) -> str | None:
    """The first NPU's name from this host's `npu-smi info` (None without npu-smi, e.g. on CPU hosts)."""
    import shutil

    from ..runtime.launcher import launch

    if not shutil.which("npu-smi"):
        return None
    lines: list[str] = []
    try:
        done = launch(["npu-smi", "info"], cwd=None, timeout_s=timeout_s, on_line=lines.append)
    except OSError:
        return None
    readings = parse_npu_smi("\n".join(lines)) if done.ok else []
    return readings[0].name if readings else None
