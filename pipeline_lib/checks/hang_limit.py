"""validate's check of training.hang_timeout_s against the planner: the watchdog counts from a rank's last finished
step, so a limit shorter than a step plus a checkpoint save declares a hang in every healthy run (and its kill and
resume repeat it: a stage that never finishes). It needs the planner's step time and checkpoint sizes, which config/
may not import."""
from __future__ import annotations

from ..config.errors import ConfigIssue
from ..config.schema import PipelineConfig
from ..planner.check import predicted_step_ms
from ..planner.disk import rank_checkpoint_bytes

# Write rate of a checkpoint save, bytes/s: serialization plus a local NVMe or a parallel file system under the
# load of a node's other ranks saving at once (an assumption, docs/planner.md); the save sits between two steps.
SAVE_BYTES_PER_S = 0.5e9
# a healthy run's slow step (a GC pause, a straggler, an evaluation between steps) should not look like a hang
MARGIN = 3.0


def busy_between_steps_s(cfg: PipelineConfig) -> tuple[float, float]:
    """(the planner's step time s, its checkpoint save time s of the largest rank's file)."""
    step_s = predicted_step_ms(cfg)[0] / 1000
    ranks = range(cfg.parallel.devices)
    save_s = max(rank_checkpoint_bytes(cfg, r) for r in ranks) / SAVE_BYTES_PER_S
    return step_s, save_s


def hang_limit_issues(cfg: PipelineConfig) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """(errors, warnings) on a training.hang_timeout_s the planner says a healthy step and save reach."""
    limit = cfg.training.hang_timeout_s
    if not limit:  # empty: derived from the measured steps; 0: off
        return [], []
    step_s, save_s = busy_between_steps_s(cfg)
    busy = step_s + save_s
    said = (f"the planner's step time is {step_s:,.3g} s and a checkpoint save {save_s:,.3g} s (the largest rank's "
            f"file at {SAVE_BYTES_PER_S / 1e9:g} GB/s), and the watchdog counts from the last finished step")
    fix = (f"set training.hang_timeout_s to at least {MARGIN * busy:,.0f} (3 x step + save), or leave it empty (10 x the "
           "median measured step time, at least 600 s)")
    if limit < busy:
        return [ConfigIssue("training.hang_timeout_s", limit, f"a healthy step and save take longer: {said}, so every "
                            "run would be declared hung and killed", fix)], []
    if limit < MARGIN * busy:
        return [], [ConfigIssue("training.hang_timeout_s", limit, f"under {MARGIN:g}x a healthy step and save: {said}; "
                                "a slow step would be declared a hang", fix)]
    return [], []
