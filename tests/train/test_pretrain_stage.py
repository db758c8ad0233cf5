"""The pretraining stage on the real data stage's output and a tiny Llama (CPU, mindformers Trainer in its own process).

The stage runs below are independent, so the module starts them together (3 at a time on 2 cores: each spends
much of its time importing MindSpore, compiling the graph and verifying checkpoints in subprocesses) and the tests
then assert on each outcome. Model: seq 64, hidden 64, 2 layers, 4 heads / 2 KV heads, vocab 2048; 4 rows per
step, 16 steps, a checkpoint every 4 steps, 2 kept. What is asserted:
- reference (and killed: training.lr_schedule=wsd, the stable-phase weights kept): loss falls (7.62 at random
  init), the lr column follows the wsd schedule step by step, the stable-phase weights are the step-12 checkpoint's
  model parameters, preflight.json (step time, tokens/s, peak RSS, predicted vs
  measured memory) judged on the first steps of the one trainer launch, manifest outputs and metrics (latest_checkpoint, final loss, steps, tokens/s, table, image);
- killed: SIGKILL of the trainer's process group 2 steps after the 2nd checkpoint, then a rerun: the step count continues
  from the last verified checkpoint, metrics.jsonl holds steps 1..16 once each (the killed attempt's steps after
  that checkpoint superseded, attempt 1 then 2) and the final weights equal the reference's (float tolerance);
The data is shuffled (training.shuffle, the default) except in nan_stop.
- nan_stop: NaN injected at step 6 stops training at step 6 with a diagnosis naming step, loss, lr, loss scale,
  global norm and the dataset rows (by position, and the same rows found by content); the last good checkpoint
  (step 4) is the latest; `llm-pipeline doctor --run-id` prints the batch's source documents;
- rollback (training.guard.on_failure=rollback): the same NaN rolls back to step 4, skips data steps 5-6 and
  finishes the 8 optimizer steps; with the data shuffled, guard_diagnosis.json names the batch's packed rows and
  source documents, and a data stage rerun with data.exclude_from drops exactly those documents;
- preflight_fail: a preflight whose peak memory exceeds parallel.device_memory_gb stops the trainer and the stage at
  its verdict, leaving no checkpoint to resume: the rerun preflights (and fails) again;
- dp2: msrun with 2 CPU ranks (data parallel), rank 1 stopped with SIGSTOP after step 3: the hang watchdog
  (training.hang_timeout_s=8) notices, names rank 1 and its host, dumps the stacks, kills the tree and resumes
  from the step-2 checkpoint; the run finishes its 6 steps with identical weights in rank_0 and rank_1;
- s3: an s3:// run store (moto): outputs and checkpoints uploaded, latest_checkpoint is a URI, and a rerun without
  the local work folder resumes from the uploaded checkpoint (nothing retrained);
plus the fast failures (missing base checkpoint, not enough disk) that must happen before anything is launched.
~3 minutes on 2 idle cores. PRETRAIN_TEST_SCENARIOS=killed,reference runs only those scenarios (development).
Never enable MindSpore's compile cache (MS_COMPILER_CACHE_ENABLE) to speed these up: it reuses a graph compiled
for another LR schedule (measured: a 16-step run silently trained with the 12-step run's schedule).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_fixtures import free_port, new_run  # noqa: E402

from pipeline_lib.storage import read_manifest  # noqa: E402
from pipeline_lib.train.checkpoints import InsufficientDiskError  # noqa: E402
from pipeline_lib.train.launch import GuardTripped  # noqa: E402
from pipeline_lib.train.metrics import read_metrics  # noqa: E402
from pipeline_lib.stages import run_stage  # noqa: E402
from pipeline_lib.train.runner import TrainerKilled  # noqa: E402
from pipeline_lib.train.stage import PreflightFailed, PretrainStageError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.timeout(1500)]


@dataclass
class Outcome:
    cfg: object
    paths: object
    manifest: object = None
    error: BaseException | None = None
    lines: list = field(default_factory=list)
    progress: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def out(self) -> Path:
        return Path(self.paths.stage_uri("pretrain"))

    def run(self, **kwargs):
        t0 = time.time()
        try:
            self.manifest, _ = run_stage(self.cfg, self.paths, "pretrain", log=self.lines.append,
                                         progress=lambda *a: self.progress.append(a), **kwargs)
        except BaseException as err:  # the test asserts on it
            self.error = err
        self.seconds += time.time() - t0
        return self


def _kill_after_checkpoints(out: Path, n: int, done: threading.Event, record: dict, save_steps: int,
                            past: int = 2) -> None:
    """SIGKILL the trainer's process group once `n` checkpoint files exist in rank_0 and metrics.jsonl is at least
    `past` steps beyond the n-th checkpoint (step n * save_steps) and not on a checkpoint step: the killed attempt
    then trained steps past its last checkpoint, which the rerun trains again. The target does not depend on when
    this thread first looked: counted from there, a thread starved on a loaded machine waited past the last step and
    the trainer finished unkilled; a kill on a checkpoint step leaves nothing to train again."""
    yaml_path, pgid = str(out / "run.yaml"), None
    while not done.is_set():
        step = max((r["step"] for r in read_metrics(out / "metrics.jsonl")), default=0)
        if pgid is None and step >= n * save_steps:  # found ahead: scanning the processes takes longer than a step
            pgid = next((_pgid(proc.pid) for proc in psutil.process_iter(["cmdline"])
                         if any(yaml_path in c for c in proc.info["cmdline"] or [])), None)
        if pgid is not None and step >= n * save_steps + past and step % save_steps and \
                len(list((out / "checkpoint" / "rank_0").glob("*.ckpt"))) >= n:
            os.killpg(pgid, signal.SIGKILL)
            record["killed_pgid"] = pgid
            record["checkpoints_at_kill"] = sorted(p.name for p in (out / "checkpoint" / "rank_0").glob("*.ckpt"))
            record["metric_steps_at_kill"] = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
            return
        time.sleep(0.02)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:  # ended between the scan and this call
        return None


def _stop_rank_after(out: Path, rank: int, step: int, done: threading.Event, record: dict) -> None:
    """SIGSTOP rank `rank`'s trainer process (its pid from its heartbeat) once it has finished `step`."""
    from pipeline_lib.train.heartbeat import read_heartbeats

    while not done.is_set():
        beat = read_heartbeats(out).get(rank)
        if beat and beat["step"] >= step:
            os.kill(beat["pid"], signal.SIGSTOP)
            record.update(pid=beat["pid"], step=beat["step"], at=time.time())
            return
        time.sleep(0.02)


def _dp2_with_a_stopped_rank(data) -> Outcome:
    o = Outcome(*new_run(data, "dp2", parallel={
        "devices": 2, "data_parallel": 2, "devices_per_node": 2, "master_port": free_port()},
        training={"steps": 6, "save_steps": 2, "global_batch_size": 8, "hang_timeout_s": 8}))
    done, record = threading.Event(), {}
    threading.Thread(target=_stop_rank_after, args=(o.out, 1, 3, done, record), daemon=True).start()
    try:
        o.run()
    finally:
        done.set()
    o.extra["stop"] = record
    return o


def _killed_then_resumed(data) -> Outcome:
    cfg, paths = new_run(data, "killed", training=WSD)
    first = Outcome(cfg, paths)
    done, record = threading.Event(), {}
    watcher = threading.Thread(target=_kill_after_checkpoints,
                               args=(first.out, 2, done, record, cfg.training.save_steps), daemon=True)
    watcher.start()
    first.run()
    done.set()
    latest_before = json.loads((first.out / "latest_checkpoint.json").read_text())
    second = Outcome(cfg, paths)
    second.extra = {"first_error": first.error, "kill": record, "latest_before": latest_before,
                    "rerun_started": time.time(), "first_lines": first.lines}
    return second.run()


def _on_s3(data, endpoint: str) -> Outcome:
    """A run whose store is s3:// (moto): the data stage is uploaded there; checkpoints upload as they verify."""
    import uuid

    import boto3

    from pipeline_lib.storage import RunPaths, join, store_for

    bucket = f"pretrain-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    cfg, local_paths = new_run(data, "s3-source", training={"steps": 4, "upload_checkpoints": True})
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_root": f"s3://{bucket}/runs",
                                                                     "s3_endpoint_url": endpoint})})
    paths = RunPaths(f"s3://{bucket}/runs", "s3-run", endpoint)
    store = store_for(paths.stage_uri("data"), endpoint)
    src = Path(local_paths.stage_uri("data"))
    for f in src.rglob("*"):
        if f.is_file():
            store.put_file(f, join(paths.stage_uri("data"), f.relative_to(src).as_posix()))
    first = Outcome(cfg, paths).run()
    # a rerun on "another machine" (the local work folder is gone) finds the uploaded checkpoint and does not train
    from pipeline_lib.storage import invalidate
    from pipeline_lib.train.session import work_dir

    work = work_dir(paths.stage_uri("pretrain"))
    first.extra["work_dir"] = work
    if first.error is None:
        first.extra["work_dir_removed"] = not work.exists()
        shutil.rmtree(work, ignore_errors=True)
        invalidate(paths.stage_uri("pretrain"), endpoint)
        second = Outcome(cfg, paths).run()
        first.extra["rerun"] = second
        shutil.rmtree(work, ignore_errors=True)
    return first


def _preflight_fails_twice(data) -> Outcome:
    """A memory limit no run meets, checkpoints every 2 steps (so the stopped trainer may have saved some), then a
    rerun of the same run. 60 steps, so that the watch (polled every second) judges while the trainer still runs:
    the default 8 tiny steps could end first under load (seen once in a clean-clone run); the trainer is stopped at
    the verdict, so the extra steps cost nothing when it works."""
    cfg, paths = new_run(data, "preflight-fail", training={"preflight_steps": 3, "save_steps": 2, "steps": 60},
                         parallel={"device_memory_gb": 0.05})
    first = Outcome(cfg, paths).run()
    first.extra["rerun"] = Outcome(cfg, paths).run()
    return first


# reference and killed train the same warmup-stable-decay (killed resumes inside its stable phase, before the decay):
# 2 warm-up steps, the last 4 of 16 decay linearly to min_lr, the weights at step 12 kept as the stable-phase weights
WSD = {"lr_schedule": "wsd", "decay_steps": 4, "keep_stable_weights": True, "min_lr": 1e-4}


def _scenarios(data, s3_endpoint=None) -> dict[str, callable]:
    nan = {"LLM_PIPELINE_INJECT_NAN_STEP": "6"}
    return {
        "s3": lambda: _on_s3(data, s3_endpoint),
        "killed": lambda: _killed_then_resumed(data),
        "reference": lambda: Outcome(*new_run(data, "reference", training={"preflight_steps": 4, **WSD})).run(),
        "rollback": lambda: Outcome(*new_run(data, "rollback", training={
            "steps": 8, "guard": {"on_failure": "rollback", "max_rollbacks": 1}})).run(env=nan),
        "dp2": lambda: _dp2_with_a_stopped_rank(data),
        # unshuffled so that the guard can name the file rows of the bad batch
        "nan_stop": lambda: Outcome(*new_run(data, "nan-stop", training={"steps": 8, "shuffle": False})).run(env=nan),
        "preflight_fail": lambda: _preflight_fails_twice(data),
    }


@pytest.fixture(scope="module")
def outcomes(pretrain_data, s3_endpoint) -> dict[str, Outcome]:
    t0 = time.time()
    only = os.environ.get("PRETRAIN_TEST_SCENARIOS")  # development: e.g. "killed,reference"
    todo = {k: v for k, v in _scenarios(pretrain_data, s3_endpoint).items() if not only or k in only.split(",")}
    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(fn) for name, fn in todo.items()}
        results = {name: f.result() for name, f in futures.items()}
    print(f"\nstage runs: {time.time() - t0:.0f} s wall; " +
          ", ".join(f"{k} {v.seconds:.0f} s" for k, v in results.items()))
    return results


def _ok(o: Outcome):
    if o.error is not None:
        raise AssertionError(f"stage failed: {o.error}\n" + "\n".join(o.lines[-40:]))
    return o.manifest


def _weights(path: str) -> dict[str, np.ndarray]:
    import mindspore as ms

    return {n: p.asnumpy() for n, p in ms.load_checkpoint(path).items()
            if "." in n and not n.startswith(("adam_m.", "adam_v.", "accu_grads"))}


def _by_step(o: Outcome) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(o.out / "metrics.jsonl")}


# ---------------------------------------------------------------- fast failures (nothing launched)

def test_missing_base_checkpoint_fails_fast(pretrain_data, tmp_path):
    cfg, paths = new_run(pretrain_data, "missing-base", model={"base_checkpoint": str(tmp_path / "nope.ckpt")})
    t0 = time.time()
    with pytest.raises(PretrainStageError, match=r"model\.base_checkpoint=.*nope\.ckpt.*no such file"):
        run_stage(cfg, paths, "pretrain", log=lambda line: None)
    assert time.time() - t0 < 5
    assert not Path(paths.stage_uri("pretrain")).exists()  # refused before the stage folder was touched


def test_missing_stable_checkpoint_fails_fast_naming_its_field(pretrain_data, tmp_path):
    cfg, paths = new_run(pretrain_data, "missing-stable", training={
        "lr_schedule": "wsd", "lineage_steps": 40, "stable_checkpoint": str(tmp_path / "gone.ckpt")})
    with pytest.raises(PretrainStageError, match=r"training\.stable_checkpoint=.*gone\.ckpt.*no such file"):
        run_stage(cfg, paths, "pretrain", log=lambda line: None)
    assert not Path(paths.stage_uri("pretrain")).exists()


def test_not_enough_disk_refuses_before_launch(pretrain_data):
    cfg, paths = new_run(pretrain_data, "no-disk")
    # keep_checkpoint_max=2: 2 kept + 1 being written, of this node's one rank
    with pytest.raises(InsufficientDiskError, match=r"need 3,000,000,000,000,000,000 bytes \(3 checkpoints .* x "
                                                    r"1,000,000,000,000,000,000 bytes per checkpoint on this node "
                                                    r"\(1 rank shard\(s\)\)\).*training\.keep_checkpoint_max \(now 2"):
        run_stage(cfg, paths, "pretrain", log=lambda line: None, checkpoint_bytes=10 ** 18)
    out = Path(paths.stage_uri("pretrain"))
    assert not (out / "run.yaml").exists() and not (out / "checkpoint").exists()
    assert read_manifest(str(out)) is None


# ---------------------------------------------------------------- trained runs

def test_reference_loss_falls_and_manifest(outcomes):
    o = outcomes["reference"]
    m = _ok(o).metrics
    steps = _by_step(o)
    assert sorted(steps) == list(range(1, 17))
    assert steps[1]["loss"] > 7.3  # ~ln(2048) at random init
    last = np.mean([steps[s]["loss"] for s in (14, 15, 16)])
    assert last < steps[1]["loss"] - 0.8, {s: r["loss"] for s, r in steps.items()}

    assert m["steps"] == m["total_steps"] == 16 and m["resumed_from_step"] is None
    assert m["final_loss"] == pytest.approx(steps[16]["loss"]) and m["loss_first"] == pytest.approx(steps[1]["loss"])
    assert m["tokens_per_s"] > 0 and m["step_time_ms"] > 0 and m["tokens_per_step"] == 256
    assert m["images"] == {"loss_curve": "loss_curve.png"}
    assert [r["step"] for r in m["tables"]["metrics"]["rows"]] == list(range(7, 17))
    latest = Path(m["latest_checkpoint"])
    assert latest.is_absolute() and latest.name == "tiny_llama_rank_0-1_16.ckpt" and latest.exists()
    assert m["latest_checkpoint_step"] == 16
    layout = m["checkpoint_layout"]  # what CheckpointRef.from_manifest reads (docs/checkpoints.md)
    assert (layout["world_size"], layout["model_parallel"], layout["pipeline_stage"], layout["step"]) == (1, 1, 1, 16)
    assert layout["ranks"]["0"]["path"] == str(latest) and layout["ranks"]["0"]["sha256"] == m["latest_checkpoint_sha256"]
    # the weights-only file every consumer takes: the model's parameters of the latest checkpoint, bit for bit, and
    # nothing of the optimizer or the training state; beside the lineage's tokenizer; what the handoff returns
    import mindspore as ms

    from pipeline_lib.model.checkpoint_cache import pretrain_checkpoint
    from pipeline_lib.model.tokenizer_lineage import tokenizer_beside
    from pipeline_lib.storage import sha256_file

    w = m["weights_checkpoint"]
    assert Path(w["path"]) == o.out / "checkpoint" / "merged" / "tiny_llama_rank_0-1_16-weights.ckpt"
    # the latest checkpoint's weights file itself (its optimizer state is in checkpoint_optimizer/): linked, not copied
    assert w["sha256"] == sha256_file(w["path"]) and w["size"] == Path(w["path"]).stat().st_size == latest.stat().st_size
    # what mindspore.load_checkpoint reads from each part (train.checkpoint_split): the weights file the model's
    # parameters and nothing of the optimizer; the optimizer file the AdamW moments of each of them and the counters
    weights = ms.load_checkpoint(str(latest))
    state = ms.load_checkpoint(str(o.out / "checkpoint_optimizer" / "rank_0" / latest.name))
    assert len(weights) == 2 * 9 + 3 and all(n.startswith(("model.", "lm_head.")) for n in weights)
    assert {f"adam_{x}.{n}" for x in "mv" for n in weights} <= set(state) and not set(weights) & set(state)
    assert {int(state[k].asnumpy().reshape(-1)[0]) for k in ("global_step", "step_num")} == {16}
    assert Path(w["path"]).stat().st_ino == latest.stat().st_ino
    full, only = weights | state, ms.load_checkpoint(w["path"])
    assert set(only) == {n for n in full if n.startswith(("model.", "lm_head."))}
    assert not any(n.startswith(("adam_m.", "adam_v.")) or n in ("global_step", "scale_sense", "loss_scale")
                   for n in only)
    assert all(only[n].asnumpy().tobytes() == full[n].asnumpy().tobytes() for n in only)
    assert pretrain_checkpoint(o.paths, {"pretrain": o.manifest}) == w["path"]
    assert tokenizer_beside(w["path"]) == str(o.out / "checkpoint" / "tokenizer.model")
    assert "checkpoint/merged/tiny_llama_rank_0-1_16-weights.ckpt" in {x["path"] for x in o.manifest.outputs}
    # keep_checkpoint_max=2: only the two newest checkpoints stay
    assert sorted(p.name for p in (o.out / "checkpoint" / "rank_0").glob("*.ckpt")) == \
        ["tiny_llama_rank_0-1_12.ckpt", "tiny_llama_rank_0-1_16.ckpt"]
    outputs = {x["path"] for x in o.manifest.outputs}
    assert {"run.yaml", "metrics.jsonl", "loss_curve.png", "latest_checkpoint.json", "preflight.json",
            "checkpoint/rank_0/tiny_llama_rank_0-1_16.ckpt"} <= outputs
    assert json.loads((o.out / "latest_checkpoint.json").read_text())["path"] == str(latest)
    run_yaml = (o.out / "run.yaml").read_text()
    for needle in ("python -m pipeline_lib.train.entry --yaml", "type: PipelineMetrics", "type: LossGuard",
                   "type: StopAtStep", "resume_training: false", f"output_dir: {o.out}"):
        assert needle in run_yaml, needle
    # progress from metrics.jsonl during training, ending at the total
    assert o.progress[-1] == ("train", 16, 16) and all(p[0] == "train" and p[2] == 16 for p in o.progress)

    pre = json.loads((o.out / "preflight.json").read_text())
    assert pre["ok"] and pre["steps"] == 4 and pre["loss_finite"] and pre["loss_falling"]
    assert pre["step_time_ms"] > 0 and pre["tokens_per_s"] > 0 and pre["peak_rss_bytes"] > 2e8
    assert pre["predicted_gb_per_device"] > 0 and "measured/predicted" in pre["memory"]
    assert m["preflight"] == pre and not (o.out / "preflight").exists()
    # the preflight rode on the training launch: one trainer import and graph compile in the whole stage
    imports = [ln for ln in o.lines if "PIPELINE_TIMING" in ln and "import_s" in ln]  # one per trainer process
    assert len(imports) == 1, imports
    assert any("training 16 steps from random init; its first 4 are the preflight" in ln for ln in o.lines)
    # the stage registry sees the manifest as complete: a rerun through it is skipped (nothing launched)
    from pipeline_lib.stages import run_stage

    assert run_stage(o.cfg, o.paths, "pretrain", log=lambda line: None)[1] is True


def test_wsd_lr_column_and_stable_phase_weights(outcomes):
    """training.lr_schedule=wsd in a real run: metrics.jsonl's lr at each step is the schedule's (linear warm-up over
    2 steps, the peak held, a linear decay over the last 4 to min_lr), and the stable-phase weights written as the
    decay started are the model's parameters of the step-12 training checkpoint, bit for bit."""
    import mindspore as ms

    from pipeline_lib.storage import sha256_file
    from pipeline_lib.train.lr_schedule import Wsd

    o = outcomes["reference"]
    m = _ok(o).metrics
    lrs = {s: r["lr"] for s, r in _by_step(o).items()}
    want = Wsd(3e-3, 1e-4, warmup_steps=2, total_steps=16, decay_steps=4)
    assert lrs == {s: pytest.approx(want.lr(s - 1), rel=1e-5, abs=1e-12) for s in range(1, 17)}
    assert lrs[1] == 0 and lrs[3] == lrs[12] == pytest.approx(3e-3) and lrs[16] == pytest.approx(1e-4)
    assert lrs[13] == pytest.approx(1e-4 + 2.9e-3 * 0.75) and lrs[14] < lrs[13]  # decaying from step 13 on
    assert m["lr_schedule"] == {"kind": "wsd", "total_steps": 16, "warmup_steps": 2, "lineage_steps": 0,
                                "decay_steps": 4, "stable_step": 12, "decay_shape": "linear", "stable_lr": 3e-3}
    stable = m["stable_checkpoint"]
    assert Path(stable["path"]) == o.out / "checkpoint" / "merged" / "tiny_llama-stable-weights.ckpt"
    assert stable["step"] == 12 and stable["sha256"] == sha256_file(stable["path"])
    assert "checkpoint/merged/tiny_llama-stable-weights.ckpt" in {x["path"] for x in o.manifest.outputs}
    at12 = ms.load_checkpoint(str(o.out / "checkpoint" / "rank_0" / "tiny_llama_rank_0-1_12.ckpt"))
    only = ms.load_checkpoint(stable["path"])
    assert set(only) == {n for n in at12 if n.startswith(("model.", "lm_head."))}
    assert all(only[n].asnumpy().tobytes() == at12[n].asnumpy().tobytes() for n in only)
    final = ms.load_checkpoint(m["weights_checkpoint"]["path"])  # the decay moved them: the handed-on weights differ
    assert any(final[n].asnumpy().tobytes() != only[n].asnumpy().tobytes() for n in only)
    assert "type: LineageWSDLR" in (o.out / "run.yaml").read_text()


def test_tensorboard_event_files_hold_the_loss_per_step(outcomes):
    """mindformers' own tensorboard section: event files under <output_root>/_tensorboard/<run.name>/<run id>/pretrain,
    holding the loss of every step as metrics.jsonl has it."""
    from tensorboard_events import event_files, read_scalars

    o = outcomes["reference"]
    folder = Path(o.cfg.run.output_root) / "_tensorboard" / o.cfg.run.name / o.paths.run_id / "pretrain"
    assert event_files(folder / "rank_0"), list(Path(o.cfg.run.output_root).rglob("*tfevents*"))
    loss = read_scalars(folder)["loss"]
    steps = _by_step(o)
    assert sorted(loss) == sorted(steps) == list(range(1, 17))
    assert all(loss[s] == pytest.approx(steps[s]["loss"], rel=1e-4) for s in steps)


def test_sigkill_then_rerun_resumes_and_matches_uninterrupted(outcomes):
    o, ref = outcomes["killed"], outcomes["reference"]
    _ok(ref)
    first = o.extra["first_error"]
    assert isinstance(first, TrainerKilled), (first, o.extra["first_lines"][-30:])
    assert "signal 9" in str(first) and o.extra["kill"]["checkpoints_at_kill"]
    m = _ok(o).metrics
    resumed = m["resumed_from_step"]
    assert resumed == o.extra["latest_before"]["step"] and resumed in (4, 8, 12)
    assert any(f"resuming at data step {resumed} (optimizer step {resumed}) of 16" in ln for ln in o.lines)
    resume_yaml = (o.out / "run_resume.yaml").read_text()
    name = Path(o.extra["latest_before"]["path"]).name
    # resumed from the weights + optimizer files joined into one (train.checkpoint_split), removed once trained
    assert f"resume_training: {name}" in resume_yaml and f"load_checkpoint: {o.out / 'checkpoint_resume'}\n" in resume_yaml
    assert not (o.out / "checkpoint_resume").exists()
    # the rerun's own metric records continue the step count after the checkpoint
    rerun = [r for r in read_metrics(o.out / "metrics.jsonl") if r["time"] >= o.extra["rerun_started"]]
    assert [r["step"] for r in rerun] == list(range(resumed + 1, 17))
    assert m["steps"] == 16 and m["attempts"] == 1
    # the file itself (not a reader that could hide repeats): each step once, the retrained ones from attempt 2
    raw = [json.loads(line) for line in (o.out / "metrics.jsonl").read_text().splitlines()]
    assert max(o.extra["kill"]["metric_steps_at_kill"]) > resumed  # the killed attempt wrote steps trained again
    assert [r["step"] for r in raw] == list(range(1, 17)), o.extra["kill"]["metric_steps_at_kill"]
    assert [r.get("attempt") for r in raw] == [1 if s <= resumed else 2 for s in range(1, 17)]
    # same losses and the same final weights (and optimizer state) as the uninterrupted run
    ref_steps = _by_step(ref)
    for r in rerun:
        assert r["loss"] == pytest.approx(ref_steps[r["step"]]["loss"], rel=1e-4, abs=1e-4), r["step"]
    a, b = _weights(m["latest_checkpoint"]), _weights(ref.manifest.metrics["latest_checkpoint"])
    assert sorted(a) == sorted(b) and len(a) == 2 * 9 + 3
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # the wsd schedule went on from the checkpoint's global step: same lr per step, and the stable-phase weights the
    # resumed attempt wrote at step 12 are the uninterrupted run's
    assert [r["lr"] for r in rerun] == pytest.approx([ref_steps[r["step"]]["lr"] for r in rerun], rel=1e-6)
    a, b = _weights(m["stable_checkpoint"]["path"]), _weights(ref.manifest.metrics["stable_checkpoint"]["path"])
    assert sorted(a) == sorted(b) and len(a) == 2 * 9 + 3
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_nan_at_step_k_stops_at_k_with_diagnosis(outcomes):
    o = outcomes["nan_stop"]
    assert isinstance(o.error, GuardTripped), (o.error, o.lines[-30:])
    text = str(o.error)
    assert "loss guard stopped training at step 6 " in text
    for needle in ("loss=nan", "lr=", "loss_scale=", "global_norm=", "batch dataset rows [20, 21, 22, 23]",
                   "last good checkpoint: step 4", "training.guard.on_failure=rollback"):
        assert needle in text, needle
    diag = o.error.diagnoses[0]
    assert diag["step"] == 6 and diag["reason"] == "nonfinite" and diag["lr"] > 0
    steps = _by_step(o)
    assert max(steps) == 6 and math.isnan(steps[6]["loss"]) and all(math.isfinite(steps[s]["loss"]) for s in range(1, 6))
    assert json.loads((o.out / "latest_checkpoint.json").read_text())["step"] == 4
    assert read_manifest(str(o.out)) is None


def test_guard_rows_by_content_equal_the_unshuffled_positions_and_doctor_prints_the_documents(outcomes, tmp_path,
                                                                                             capsys):
    import yaml

    from pipeline_lib.doctor.cli import doctor_main

    o = outcomes["nan_stop"]
    assert isinstance(o.error, GuardTripped), (o.error, o.lines[-30:])
    diag = o.error.diagnoses[0]
    # unshuffled, the rows are known by position (metrics.batch_rows); found by content they must be the same
    assert [[hit["global_row"] for hit in hits] for hits in diag["batch_found"]] == [[20], [21], [22], [23]]
    names = json.loads((o.out / "guard_diagnosis.json").read_text())["documents"]
    assert names and all(d["steps"] == [6] for d in names)
    config = tmp_path / "nan-stop.yaml"
    config.write_text(yaml.safe_dump(o.cfg.model_dump(mode="json")))
    assert doctor_main(["--run-id", "nan-stop", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "category: nan_or_overflow" in printed and "documents in the batches the loss guard stopped at" in printed
    for d in names:
        assert f"id {json.dumps(d['id'])} origin {d['origin']}" in printed
    assert f"data.exclude_from=[{o.out / 'guard_diagnosis.json'}]" in printed


def _sidecar_spans(data_dir: Path) -> dict[str, list[dict]]:
    return {p.name.replace(".docs.jsonl", ".mindrecord"): [json.loads(ln) for ln in p.read_text().splitlines()]
            for p in sorted((data_dir / "mindrecord" / "train").glob("*.docs.jsonl"))}


def test_a_shuffled_bad_batch_is_named_by_documents_and_exclude_from_drops_exactly_them(outcomes, pretrain_data,
                                                                                       tmp_path):
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.storage import RunPaths
    from pipeline_lib.storage.mindrecord import read_mindrecord_columns
    from pretrain_fixtures import TINY, merge

    o = outcomes["rollback"]
    m = _ok(o).metrics
    path = o.out / "guard_diagnosis.json"
    assert "guard_diagnosis.json" in {x["path"] for x in o.manifest.outputs}
    report = json.loads(path.read_text())
    (trip,) = report["trips"]
    assert trip["step"] == 6 and trip["reason"] == "nonfinite" and trip["documents_error"] is None
    guard = json.loads((o.out / "guard" / "rank_0.json").read_text())
    rows = trip["batch_rows"]
    assert len(rows) == 4 and rows != [20, 21, 22, 23]  # shuffled: not the file order's batch 6
    assert f"dataset rows {rows} (found by content)" in trip["batch_where"]
    # each named row holds the tokens the batch tensor held (batch_head: its first 8 tokens of each row)
    data_dir = pretrain_data.data_dir
    files = sorted((data_dir / "mindrecord" / "train").glob("*.mindrecord"))
    ids = np.concatenate([read_mindrecord_columns([f], ["input_ids"])["input_ids"] for f in files])
    for hits, head in zip(guard["batch_found"], guard["batch_head"]):
        assert [ids[h["global_row"]][:8].tolist() for h in hits] == [head]
    # the documents are the sidecars' spans over those rows
    spans = _sidecar_spans(data_dir)
    expected = {span["origin"]: span["id"] for hits in guard["batch_found"] for h in hits
                for span in spans[h["file"]] if span["row_start"] <= h["row"] <= span["row_end"]}
    named = {d["origin"]: d["id"] for d in report["documents"]}
    assert named == expected and len(named) >= 2
    assert m["rollbacks"][0]["rows"] == rows
    # the next run drops exactly them in the data stage: counted as filtered by reason guard, listed in excluded.jsonl
    raw = merge(TINY, {"run": {"output_root": str(tmp_path / "runs")}, "data": {"exclude_from": [str(path)]}})
    cfg = config_from_dict(raw)
    paths = RunPaths(str(tmp_path / "runs"), "excluded")
    manifest, _ = run_stage(cfg, paths, "data", workers=1)
    folder = Path(paths.stage_uri("data"))
    stats, before = (json.loads((f / "stats.json").read_text()) for f in (folder, data_dir))
    assert stats["total"]["filtered"]["guard"] == len(named)
    assert stats["total"]["kept"] == before["total"]["kept"] - len(named)
    dropped = [json.loads(ln) for ln in (folder / "excluded.jsonl").read_text().splitlines()]
    assert {d["origin"]: d["id"] for d in dropped if d["reason"] == "guard"} == named
    trained_before = {span["origin"] for file_spans in spans.values() for span in file_spans}
    trained_now = {span["origin"] for file_spans in _sidecar_spans(folder).values() for span in file_spans}
    assert trained_now == trained_before - set(named)


def test_rollback_skips_the_bad_window_and_finishes(outcomes):
    o = outcomes["rollback"]
    m = _ok(o).metrics
    (rb,) = m["rollbacks"]
    assert (rb["bad_step"], rb["from_step"], rb["skipped_steps"], rb["reason"]) == (6, 4, [5, 6], "nonfinite")
    assert any("rollback 1/1: back to step 4, skipping data steps 5..6" in ln for ln in o.lines)
    # shuffled data (the default): the guard names the batch's position under the seed, not file rows
    assert any(f"a shuffled batch (training.shuffle, seed {o.cfg.run.seed}): batch 6 of epoch 1" in ln
               for ln in o.lines)
    assert m["steps"] == 8 and m["data_steps"] == 10  # 8 optimizer steps over data steps 1-4 and 7-10
    records = read_metrics(o.out / "metrics.jsonl")
    after = [r["step"] for r in records if r["step"] > 6]
    assert after == [7, 8, 9, 10] and all(math.isfinite(r["loss"]) for r in records if r["step"] != 6)


def test_failed_preflight_stops_the_trainer_and_a_rerun_preflights_again(outcomes):
    o = outcomes["preflight_fail"]
    for attempt in (o, o.extra["rerun"]):
        assert isinstance(attempt.error, PreflightFailed), (attempt.error, attempt.lines[-30:])
        text = str(attempt.error)
        assert "peak host memory" in text and "exceeds the limit 0.05 GB" in text
        assert "training.micro_batch_size" in text and "measured/predicted" in text
        # the watch stopped the trainer at its verdict (it polls every second)
        assert any(ln.startswith("[preflight] preflight failed") for ln in attempt.lines), attempt.lines[-30:]
    pre = json.loads((o.out / "preflight.json").read_text())
    assert pre["ok"] is False and pre["steps"] == 3 and pre["loss_finite"]
    # nothing of the stopped run can be resumed: checkpoints gone, the folder's identity is no run's
    assert not (o.out / "checkpoint").exists() and read_manifest(str(o.out)) is None
    assert json.loads((o.out / "identity.json").read_text())["identity"] is None
    assert not any("(resume)" in ln for ln in o.extra["rerun"].lines)


def test_two_rank_data_parallel_identical_weights(outcomes):
    o = outcomes["dp2"]
    m = _ok(o).metrics
    assert m["steps"] == 6 and m["ranks"] == [0, 1]
    ckpts = m["checkpoints"]
    assert sorted(ckpts) == ["0", "1"] and "rank_1" in ckpts["1"]
    assert {f"checkpoint/rank_{r}/{Path(ckpts[str(r)]).name}" for r in (0, 1)} <= {x["path"] for x in o.manifest.outputs}
    assert any("mindspore.parallel.cluster.run" in ln or "worker_1" in ln for ln in o.lines)
    a, b = _weights(ckpts["0"]), _weights(ckpts["1"])
    assert sorted(a) == sorted(b) and len(a) == 2 * 9 + 3
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert m["tokens_per_step"] == 512


def test_a_stopped_rank_is_a_hang_named_by_the_doctor_and_the_resume_finishes(outcomes):
    from pipeline_lib.doctor.classify import diagnose
    from pipeline_lib.doctor.logs import read_logs, stage_log_files

    o = outcomes["dp2"]
    m = _ok(o).metrics
    stop = o.extra["stop"]
    assert stop, "rank 1 was never stopped"
    (hang,) = m["hangs"]
    # noticed within the hang limit: 8 s without a finished step, plus the 1 s poll
    assert 8 <= hang["time"] - stop["at"] <= 8 + 1 + 2, hang["time"] - stop["at"]
    assert hang["first_ranks"] == [1] and hang["step"] == stop["step"] and hang["hosts"] == [os.uname().nodename]
    assert hang["ranks"]["1"]["state"] == "stopped" and hang["attempt"] == 1
    rank0 = Path(hang["stacks"]).read_text().split("=== rank 1")[0]
    assert "=== rank 0" in rank0 and "mindspore/train/model.py" in rank0  # its Python stack inside the train loop
    # what `llm-pipeline doctor --run-id ID CONFIG --stage pretrain` reads: the stage folder's logs
    diag = diagnose(read_logs(stage_log_files(o.out)))
    assert diag.category == "hang" and diag.retry is True
    assert f"stopped first: rank(s) 1 on host {os.uname().nodename} after step {stop['step']}" in diag.evidence[0]
    # the resume: from the last verified checkpoint before the hang, every step once in metrics.jsonl
    assert m["attempts"] == 2
    assert any("training 6 steps from tiny_llama_rank_0-" in ln and "(resume)" in ln for ln in o.lines)
    said = [ln for ln in o.lines if ln.startswith("pretrain: WARNING training hung after step")]
    assert len(said) == 1 and f"resumes from the checkpoint of step {m['resumed_from_step']}" in said[0]
    assert m["resumed_from_step"] is not None and m["resumed_from_step"] <= stop["step"]
    raw = [json.loads(line) for line in (o.out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in raw) == list(range(1, 7)) and {r["attempt"] for r in raw} == {1, 2}


def test_s3_store_uploads_outputs_and_a_rerun_elsewhere_resumes_from_the_upload(outcomes):
    from pipeline_lib.storage import join, store_for

    o = outcomes["s3"]
    m = _ok(o).metrics
    stage = o.paths.stage_uri("pretrain")
    store = store_for(stage, o.paths.endpoint_url)
    assert m["latest_checkpoint"] == join(stage, "checkpoint/rank_0/tiny_llama_rank_0-1_4.ckpt")
    assert store.exists(m["latest_checkpoint"]) and store.exists(join(stage, "manifest.json"))
    rerun = o.extra["rerun"]
    for out in _ok(rerun).outputs:
        assert store.size(join(stage, out["path"])) == out["size"], out["path"]
    assert {"run.yaml", "metrics.jsonl", "loss_curve.png", "latest_checkpoint.json"} <= {x["path"] for x in o.manifest.outputs}
    # training.upload_checkpoints: the checkpoint and its verification went up as training ran
    assert store.exists(join(stage, "checkpoint", "latest_checkpoint.json"))
    assert store.exists(m["latest_checkpoint"] + ".verified.json")
    assert not Path(stage).exists()  # nothing written to a local folder named like the URI
    assert o.extra["work_dir_removed"]  # the local work folder goes once the manifest is in the store
    m2 = _ok(rerun).metrics
    assert any("downloaded the uploaded checkpoint of step 4" in ln for ln in rerun.lines)
    assert not any("pretrain: training 4 steps" in ln for ln in rerun.lines) and m2["attempts"] == 0
    assert m2["latest_checkpoint"] == m["latest_checkpoint"] and m2["latest_checkpoint_sha256"] == m["latest_checkpoint_sha256"]


@pytest.mark.train
@pytest.mark.e2e
@pytest.mark.usefixtures("prefect_server")
def test_a_trainer_killed_mid_run_is_retried_by_the_flow_and_resumes(pretrain_data):
    """kill -9 of the trainer (not of the run) mid-pretraining, no OOM evidence: the same flow run retries the stage
    (doctor: killed), the retry resumes from the last verified checkpoint and finishes; metrics.jsonl holds each
    step once."""
    from flows.pipeline import llm_pipeline

    cfg, paths = new_run(pretrain_data, "flow-killed",
                         orchestration={"task_retries": 1, "retry_delay_seconds": 0.1})
    out = Path(paths.stage_uri("pretrain"))
    done, record = threading.Event(), {}
    watcher = threading.Thread(target=_kill_after_checkpoints, args=(out, 2, done, record, cfg.training.save_steps),
                               daemon=True)
    watcher.start()
    try:
        state = llm_pipeline(config=cfg.model_dump(mode="json"), run_id="flow-killed", stages=["pretrain"],
                             return_state=True)
    finally:
        done.set()
    assert record.get("killed_pgid"), "the trainer was never killed"
    assert state.is_completed(), state.message
    m = read_manifest(str(out)).metrics
    assert m["resumed_from_step"] in (4, 8, 12) and m["steps"] == 16
    raw = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in raw] == list(range(1, 17))
