"""The stage contract.

A stage is one function `run_<name>_stage(run: StageRun) -> StageOutput`. It gets its config,
its run paths and the manifests of the stages it reads (resolved by the registry); it writes its
files under `run.uri` (publishing them there if it worked in a scratch folder) and returns what
it wrote and what it measured. It does not compute its identity and does not write manifest.json:
the registry (pipeline_lib.stages) does both, once, after the stage returns, so "done" means the
same thing whoever ran the stage (CLI, Prefect task, nightly job, a test).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..config.schema import PipelineConfig
from ..storage import Manifest, RunPaths

Log = Callable[[str], None]
Progress = Callable[[str, int, int], None]


class TransientError(RuntimeError):
    """A failure worth retrying: storage/network hiccup, a lost worker. Config/data errors are not."""


@dataclass
class StageRun:
    """What a stage is given."""

    name: str
    cfg: PipelineConfig
    paths: RunPaths
    upstream: dict[str, Manifest] = field(default_factory=dict)  # required ones always, optional when done
    log: Log = print
    progress: Progress | None = None
    identity: str = ""  # the registry's hash of this stage's config fields + upstream fingerprints (for
                        # work that must not be resumed across identities, e.g. a half-trained checkpoint)
    node_rank: int = 0  # which node of a multi-node job this is (runtime/nodes.py); 0 for every other stage

    @property
    def uri(self) -> str:
        """The stage's folder in the run store (local path or s3:// URI)."""
        return self.paths.stage_uri(self.name)

    @property
    def endpoint(self) -> str | None:
        return self.paths.endpoint_url

    @property
    def store(self):
        """The store the run lives in (local or S3)."""
        return self.paths.store()

    @property
    def remote(self) -> bool:
        """True when the run store is not this machine's disk: the stage works in a local folder and
        uploads its outputs."""
        return self.store.remote

    def upstream_uri(self, stage: str) -> str:
        return self.paths.stage_uri(stage)


@dataclass
class StageOutput:
    """What a stage returns: every file it wrote (path relative to its folder, size, sha256) and
    its metrics (figures, plus `tables` / `images` / `markdown` the Prefect artifacts render)."""

    outputs: list[dict]
    metrics: dict = field(default_factory=dict)
