"""Checkpoint manager over a training output_dir: verify, point `latest` at a good step, prune, upload.

Layout (mindformers 1.9 CheckpointMonitor, measured): `<output_dir>/checkpoint/rank_N/<prefix>_rank_N-<E>_<S>.ckpt`
plus mindformers' `meta.json`. <S> counts within epoch <E> and restarts after a resume, so order and identity
come from the file's contents: mindformers appends `step_num` (batches consumed, across resumes), `global_step`
(optimizer steps), `epoch_num`, `loss_scale`, next to the weights and AdamW moments (`adam_m.*`, `adam_v.*`).
MindSpore writes `<name>.tmp` and renames it: a `.ckpt` name means the write finished.

- `verify_checkpoints(paths)`: ok = loadable and every float tensor finite. Each file is read in place first
  (model.ckpt_scan: no MindSpore import, no copy); what that reader does not understand or finds bad is loaded
  with `mindspore.load_checkpoint` in one subprocess (the orchestrator never holds MindSpore state), whose verdict
  and reason stand.
- `CheckpointManager.sync()`: verifies new files and writes `<ckpt>.verified.json` (sha256, size, step) next to
  good ones, after splitting each good one into its weights (in place) and its optimizer state
  (`checkpoint_optimizer/rank_N/`, train.checkpoint_split; a LoRA run's keeps only what it trains: `keep_weight`,
  `base`); the sidecar's `split` names the parts; moves bad ones to `<output_dir>/checkpoint_rejected/rank_N/` with
  a `.reason.json`; keeps the
  newest `keep` verified steps; uploads what `upload_uri` lacks; then rewrites `<output_dir>/latest_checkpoint.json`
  (remote copy first) to the newest step that every rank in `ranks` has verified. Call it from
  `launch(on_tick=...)` and once after training; resume from `latest()["path"]`, not from meta.json.
- `check_disk(path, needed, what, fix)`: refuse to start when the checkpoints a stage keeps do not fit (the
  stages size them with planner.disk); `estimate_checkpoint_bytes(...)`: one checkpoint's bytes from a parameter count.

Limits: a file the in-place reader leaves to MindSpore is read whole into the verifier's memory and costs a
MindSpore import (~1.5-4 s); `ranks` are the ranks whose files this node holds. Raises InsufficientDiskError,
ValueError (bad arguments); upload errors propagate and are retried by the next sync.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..model.ckpt_scan import scan
from ..model.checkpoint_format import finished_model_files, remove_iteration_if_empty
from ..model.checkpoint_format import inspect as inspect_safetensors
from ..runtime.launcher import launch_module
from .. import killpoints
from ..storage import join, sha256_file, store_for
from .checkpoint_split import OPTIMIZER_DIR, Unreadable, optimizer_file

CKPT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d+)_(?P<step>\d+)\.ckpt$")
LATEST_FILE = "latest_checkpoint.json"
REJECTED_DIR = "checkpoint_rejected"
_MARK = "CKPT_VERIFY "
OPTIMIZER_UPLOAD = "optimizer/"  # a rank's optimizer parts upload beside its weights, under rank_N/optimizer/


def remote_latest_name(node_rank: int) -> str:
    """The uploaded latest-checkpoint pointer of node `node_rank` (node 0 keeps the historical name)."""
    return LATEST_FILE if node_rank == 0 else f"latest_checkpoint_node_{node_rank}.json"


class InsufficientDiskError(RuntimeError):
    """Not enough free disk for the checkpoints a run will write."""


@dataclass(frozen=True)
class CheckpointFile:
    path: Path
    rank: int
    epoch: int
    step_in_epoch: int

    @property
    def sidecar(self) -> Path:
        return self.path.with_name(self.path.name + ".verified.json")

    def verification(self) -> dict:
        """The sidecar written after verification: sha256, size, global_step, params, verified_at."""
        return json.loads(self.sidecar.read_text(encoding="utf-8"))


def list_checkpoints(output_dir: str | Path, subdir: str = "checkpoint") -> list[CheckpointFile]:
    """Finished checkpoints under <output_dir>/<subdir>/rank_N/, oldest first (by epoch, step, rank)."""
    out = []
    for rank_dir in Path(output_dir, subdir).glob("rank_*"):
        if not rank_dir.name[5:].isdigit():
            continue
        for path in rank_dir.glob("*.ckpt"):
            m = CKPT_NAME.match(path.name)
            if m:
                out.append(CheckpointFile(path, int(rank_dir.name[5:]), int(m["epoch"]), int(m["step"])))
    # training.checkpoint_format=safetensors: iteration_N/ folders, one model file per rank (model/checkpoint_format.py)
    out += [CheckpointFile(path, rank, 0, step) for path, rank, step in finished_model_files(Path(output_dir, subdir))]
    return sorted(out, key=lambda c: (c.epoch, c.step_in_epoch, c.rank))


@dataclass
class VerifyResult:
    path: str
    ok: bool
    error: str | None = None
    params: int = 0
    nonfinite: list[str] | None = None
    global_step: int | None = None  # optimizer steps (overflow-skipped steps do not count)
    step_num: int | None = None     # batches consumed, across resumes (mindformers' resume position)
    epoch_num: int | None = None
    sha256: str | None = None
    size: int | None = None


def _scanned(path: str) -> VerifyResult | None:
    """The verdict of reading the file in place (model.ckpt_scan) when that reader understands it and finds every
    float tensor finite; None sends the file to MindSpore (a bad file's reason is MindSpore's to give)."""
    killpoints.reached("checkpoint.verify")
    if path.endswith(".safetensors"):  # a Checkpoint 2.0 step: model + optimizer file + common.json
        got = inspect_safetensors(path)
        if got is None or got["nonfinite"]:
            return None
        return VerifyResult(path, True, None, got["params"], [], got["global_step"], got["step_num"], got["epoch_num"])
    found = scan(path)
    if found is None or found.nonfinite:
        return None
    return VerifyResult(path, True, None, len(found.tensors), [], found.counter("global_step"),
                        found.counter("step_num"), found.counter("epoch_num"))


def verify_checkpoints(paths: Iterable[str | Path], timeout_s: float = 900) -> list[VerifyResult]:
    """ok = loadable and every float tensor finite: read in place when model.ckpt_scan understands the file and
    finds it good, else loaded in one fresh MindSpore process (the authority on anything else)."""
    paths = [str(p) for p in paths]
    # An absent or empty file needs no MindSpore process to judge.
    missing = {p: VerifyResult(p, False, "file is missing" if not os.path.exists(p) else "file is empty")
               for p in paths if not os.path.exists(p) or os.path.getsize(p) == 0}
    found = {p: res for p in paths if p not in missing and (res := _scanned(p)) is not None}
    todo = [p for p in paths if p not in missing and p not in found]
    crash = ""
    if todo:
        def on_line(line: str) -> None:
            if line.startswith(_MARK):
                record = json.loads(line[len(_MARK):])
                found[record["path"]] = VerifyResult(**record)

        done = launch_module("pipeline_lib.train.checkpoints", ["verify", *todo], cwd=None, timeout_s=timeout_s,
                             on_line=on_line)
        crash = (f"verifier timed out after {timeout_s:g}s" if done.timed_out else
                 f"verifier exited with {done.returncode}: " + "\n".join(done.tail[-10:])[-500:])
    return [missing.get(p) or _hashed(found.get(p) or VerifyResult(p, False, crash)) for p in paths]


def _hashed(res: VerifyResult) -> VerifyResult:
    """Hash what was verified: a later change of the file shows up as a sha mismatch."""
    if not res.ok:
        return res
    try:
        res.sha256, res.size = sha256_file(res.path), os.path.getsize(res.path)
    except OSError as err:  # rotated away by keep_checkpoint_max after the load: not verified
        return VerifyResult(res.path, False, f"file disappeared during verification ({err})")
    return res


def _verify_main(paths: list[str]) -> None:
    """Runs in the verifier subprocess: one `CKPT_VERIFY {json}` line per path."""
    import numpy as np
    import mindspore as ms

    for path in paths:  # (the kill point checkpoint.verify was passed in _scanned, before this process)
        try:
            params = ms.load_checkpoint(path, format="safetensors" if path.endswith(".safetensors") else "ckpt")
            bad = [name for name, p in params.items()
                   if np.issubdtype(p.asnumpy().dtype, np.floating) and not np.isfinite(p.asnumpy()).all()]
            meta = {k: int(params[k].asnumpy().reshape(-1)[0]) if k in params else None
                    for k in ("global_step", "step_num", "epoch_num")}
            res = VerifyResult(path, not bad, f"non-finite values in {len(bad)} tensor(s), e.g. {bad[:3]}"
                               if bad else None, len(params), bad[:20], **meta)
        except Exception as err:  # the reason is the verdict; the caller decides what to do
            res = VerifyResult(path, False, f"{type(err).__name__}: {err}")
        print(_MARK + json.dumps(asdict(res)), flush=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def estimate_checkpoint_bytes(param_count: int, weight_bytes: int = 4, optimizer_states: int = 2,
                              state_bytes: int = 4) -> int:
    """Bytes of one resumable checkpoint: weights + AdamW moments (fp32), as mindformers saves them."""
    return int(param_count) * (weight_bytes + optimizer_states * state_bytes)


def expected_checkpoint_bytes(output_dir: str | Path, param_count: int | None = None, **estimate) -> int:
    """Size of the largest checkpoint already under output_dir (a resumed run), else the estimate from
    `param_count`. Raises ValueError when there is neither."""
    opt = lambda c: optimizer_file(c.path).stat().st_size if optimizer_file(c.path).exists() else 0  # noqa: E731
    sizes = [c.path.stat().st_size + opt(c) for c in list_checkpoints(output_dir)]  # both parts of a split one
    if sizes:
        return max(sizes)
    if param_count is None:
        raise ValueError(f"no checkpoint under {output_dir} to measure and no param_count to estimate from")
    return estimate_checkpoint_bytes(param_count, **estimate)


def check_disk(path: str | Path, needed: int, what: str, fix: str) -> int:
    """Free bytes at `path` (or its nearest existing parent); raises InsufficientDiskError naming `what` the
    `needed` bytes are and `fix` when fewer are free."""
    probe = Path(path).resolve()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise InsufficientDiskError(
            f"not enough free disk for checkpoints under {path}: need {int(needed):,} bytes ({what}), free "
            f"{free:,} bytes on the filesystem of {probe}. Fix: {fix}")
    return free


class CheckpointManager:
    """Verifies, uploads, points `latest` at and prunes the checkpoints of one training output_dir."""

    def __init__(self, output_dir: str | Path, *, ranks: Iterable[int] = (0,), keep: int | None = None,
                 upload_uri: str | None = None, endpoint_url: str | None = None, subdir: str = "checkpoint",
                 log: Callable[[str], None] = print, node_rank: int = 0, split: bool = True,
                 keep_weight: Callable[[str], bool] | None = None, base: dict | None = None):
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep!r}: must be >= 1 (training.keep_checkpoint_max) or None")
        self.output_dir, self.ranks, self.keep = Path(output_dir), sorted(set(ranks)), keep
        self.upload_uri, self.endpoint_url, self.subdir, self.log = upload_uri, endpoint_url, subdir, log
        self.latest_path = self.output_dir / LATEST_FILE
        # each node uploads the pointer to its own ranks' files: several nodes never overwrite each other's
        self.remote_latest = remote_latest_name(node_rank)
        self._uploaded: set[Path] = set()  # checked or put this session; a new manager re-checks once
        # split: each verified file becomes weights + checkpoint_optimizer/ (train.checkpoint_split); keep_weight and
        # base ({path, sha256, size}): a LoRA run keeps only what it trains, its frozen weights are the base's
        self.split, self.keep_weight, self.base = split, keep_weight, base
        self._base_scan = None

    def latest(self) -> dict | None:
        return json.loads(self.latest_path.read_text(encoding="utf-8")) if self.latest_path.exists() else None

    def _uri(self, ckpt: CheckpointFile, name: str | None = None) -> str:
        return join(self.upload_uri, f"rank_{ckpt.rank}", name or ckpt.path.name)

    def sync(self) -> list[VerifyResult]:
        """Verify new checkpoints, prune, upload what the remote lacks, move `latest`. Returns new verdicts.

        Upload errors propagate; the next sync retries them (a file counts as uploaded when the remote
        object exists with the local size).
        """
        new = [c for c in list_checkpoints(self.output_dir, self.subdir)
               if c.rank in self.ranks and not c.sidecar.exists()]
        results = verify_checkpoints([c.path for c in new])
        for ckpt, res in zip(new, results):
            if not res.ok and not ckpt.path.exists():  # rotated away by keep_checkpoint_max meanwhile
                self.log(f"[checkpoints] {ckpt.path.name} disappeared before it was verified; skipped")
                continue
            if not res.ok:
                self._reject(ckpt, res)
                continue
            try:
                # a Checkpoint 2.0 step is written split (model + opt files) by mindformers itself
                split = self._split(ckpt, res) if self.split and ckpt.path.suffix == ".ckpt" else None
            except Unreadable as err:  # resume and hand-off read a whole file as before
                self.log(f"[checkpoints] {ckpt.path.name} kept whole: {err}")
                split = None
            # step: mindformers' step_num (consistent across ranks and resumes); plain MindSpore files
            # without it fall back to the optimizer step, then to the step in the file name.
            step = next(v for v in (res.step_num, res.global_step, ckpt.step_in_epoch) if v is not None)
            _write_atomic(ckpt.sidecar, json.dumps({"file": ckpt.path.name, "sha256": res.sha256, "size": res.size,
                                                    "step": step, "global_step": res.global_step,
                                                    "epoch": res.epoch_num, "params": res.params, "split": split,
                                                    "verified_at": time.time()}, indent=2))
            self.log(f"[checkpoints] verified {ckpt.path.name} (rank {ckpt.rank}, step {step}, {res.size:,} bytes)")
            killpoints.reached("checkpoint.before_latest")
        if self.keep:
            self.prune(self.keep)
        if self.upload_uri:
            self._upload_missing()
        self._update_latest()
        return results

    def _split(self, ckpt: CheckpointFile, res: VerifyResult) -> dict:
        """Split the verified whole file `ckpt` into weights + optimizer state (train.checkpoint_split); `res` then
        describes the weights file. A file a crash left split before its sidecar takes its counters from its
        optimizer file."""
        from ..model.ckpt_scan import scan as scan_file
        from .checkpoint_split import optimizer_file, split_checkpoint

        opt = optimizer_file(ckpt.path)
        if res.step_num is None and res.global_step is None and opt.exists():  # split already, sidecar not written
            found = scan_file(opt)
            res.step_num, res.global_step, res.epoch_num = (found.counter(k) if found else None
                                                            for k in ("step_num", "global_step", "epoch_num"))
            dropped = None
        else:
            if self.base is not None and self._base_scan is None:
                self._base_scan = scan_file(self.base["path"])
            kw = {"keep": self.keep_weight} if self.keep_weight else {}
            done = split_checkpoint(ckpt.path, opt, base=self.base["path"] if self.base else None,
                                    base_scan=self._base_scan, **kw)
            dropped = done.dropped if self.base is not None else None
            res.sha256, res.size = sha256_file(ckpt.path), ckpt.path.stat().st_size
        return {"optimizer": {"file": opt.name, "size": opt.stat().st_size, "sha256": sha256_file(opt)},
                "frozen_in_base": None if dropped is None else len(dropped), "frozen_names": dropped, "base": self.base}

    def _upload_missing(self) -> None:
        store = store_for(self.upload_uri, self.endpoint_url)
        for by_rank in self.verified().values():
            for c in by_rank.values():
                if c.path in self._uploaded:
                    continue
                pairs = [(c.path, self._uri(c)), (c.sidecar, self._uri(c, c.sidecar.name))]
                if optimizer_file(c.path).exists():
                    pairs.insert(1, (optimizer_file(c.path), self._uri(c, OPTIMIZER_UPLOAD + c.path.name)))
                for local, uri in pairs:
                    if not (store.exists(uri) and store.size(uri) == local.stat().st_size):
                        store.put_file(local, uri)
                        killpoints.reached("checkpoint.mid_upload")
                self._uploaded.add(c.path)
                self.log(f"[checkpoints] uploaded {c.path.name} to {self._uri(c)}")
        # the strategy files of a parallel run (<output_dir>/strategy/) go next to the checkpoint folder: without
        # them the rank files cannot be merged or resharded
        for local in sorted((self.output_dir / "strategy").glob("*.ckpt")):
            uri = join(self.upload_uri.rstrip("/").rsplit("/", 1)[0], "strategy", local.name)
            if not (store.exists(uri) and store.size(uri) == local.stat().st_size):
                store.put_file(local, uri)

    def _reject(self, ckpt: CheckpointFile, res: VerifyResult) -> None:
        # Moved out of checkpoint/ so neither we nor mindformers' resume ever pick it up again.
        dest = self.output_dir / REJECTED_DIR / f"rank_{ckpt.rank}" / ckpt.path.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(ckpt.path), dest)
        _write_atomic(dest.with_name(dest.name + ".reason.json"), json.dumps(asdict(res), indent=2))
        self.log(f"[checkpoints] REJECTED {ckpt.path.name} (rank {ckpt.rank}): {res.error}; moved to {dest}")

    def verified(self) -> dict[int, dict[int, CheckpointFile]]:
        """Verified checkpoints grouped by step (from their sidecars), then by rank."""
        out: dict[int, dict[int, CheckpointFile]] = {}
        for c in list_checkpoints(self.output_dir, self.subdir):
            if c.rank in self.ranks and c.sidecar.exists():
                out.setdefault(int(c.verification()["step"]), {})[c.rank] = c
        return out

    def _update_latest(self) -> None:
        verified = self.verified()
        complete = [step for step, by_rank in verified.items() if set(by_rank) == set(self.ranks)]
        if not complete:
            return
        step = max(complete)
        current = self.latest()
        if current and current["step"] >= step and Path(current["path"]).exists():
            return
        by_rank = verified[step]
        ranks = {}
        for rank, c in sorted(by_rank.items()):
            v = c.verification()
            ranks[str(rank)] = {"path": str(c.path), "sha256": v["sha256"], "size": v["size"],
                                "global_step": v["global_step"], "uri": self._uri(c) if self.upload_uri else None}
        first = ranks[str(self.ranks[0])]
        record = {"step": step, "global_step": first["global_step"], "path": first["path"],
                  "sha256": first["sha256"], "size": first["size"], "uri": first["uri"], "ranks": ranks,
                  "updated_at": time.time()}
        text = json.dumps(record, indent=2)
        if self.upload_uri:  # the remote pointer only after its files are there
            store_for(self.upload_uri, self.endpoint_url).put_bytes(join(self.upload_uri, self.remote_latest),
                                                                   text.encode())
        _write_atomic(self.latest_path, text)
        self.log(f"[checkpoints] latest -> step {step} ({Path(first['path']).name})")

    def prune(self, keep: int) -> list[Path]:
        """Delete all but the newest `keep` verified steps (never the one `latest` names), here and remotely."""
        latest = self.latest()
        pinned = latest["step"] if latest else None
        verified = self.verified()
        removed = []
        for step in sorted(verified)[:-keep]:
            if step == pinned:
                continue
            for c in verified[step].values():
                for p in (c.path, optimizer_file(c.path), c.sidecar):
                    if p.exists():
                        p.chmod(0o600)  # MindSpore leaves checkpoints read-only
                        p.unlink()
                remove_iteration_if_empty(c.path.parent)
                if self.upload_uri:
                    store = store_for(self.upload_uri, self.endpoint_url)
                    store.delete(self._uri(c))
                    store.delete(self._uri(c, OPTIMIZER_UPLOAD + c.path.name))
                    store.delete(self._uri(c, c.sidecar.name))
                    self._uploaded.discard(c.path)
                removed.append(c.path)
        # optimizer parts whose weights mindformers' own keep_checkpoint_max rotated away
        for opt in Path(self.output_dir, OPTIMIZER_DIR).glob("rank_*/*.ckpt"):
            if not (self.output_dir / self.subdir / opt.parent.name / opt.name).exists():
                opt.chmod(0o600)
                opt.unlink()
                removed.append(opt)
        return removed


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "verify":
        sys.exit("usage: python -m pipeline_lib.train.checkpoints verify CKPT...")
    _verify_main(sys.argv[2:])
