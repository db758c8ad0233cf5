"""The runs under a config's output root, so a command given a run id that names none can say so.

A run is known when its folder holds a stage manifest or a stage log (`<root>/<id>/<stage>/manifest.json`,
`<root>/<id>/logs/*.log`: what `run` writes first and last); folders whose name starts with `_` (the dedup index,
the nightly state, TensorBoard) are not runs. Works for a local and an s3:// output root (one glob each).
"""
from __future__ import annotations

from .storage import RunPaths, join
from .storage.names import BadName, check_name

SHOWN = 20  # the newest ones, when a root holds hundreds of nights


def known_run_ids(cfg) -> list[str]:
    """The run ids under run.output_root, sorted by name (run and night ids start with their date)."""
    store = RunPaths(cfg.run.output_root, "probe", cfg.run.s3_endpoint_url).store()
    root = cfg.run.output_root.rstrip("/")
    ids = set()
    for pattern in ("*/*/manifest.json", "*/logs/*.log"):
        for uri in store.glob(join(root, pattern)):
            run_id = uri[len(root):].lstrip("/").split("/", 1)[0]
            try:
                if not run_id.startswith("_"):
                    ids.add(check_name("run_id", run_id))
            except BadName:
                continue
    return sorted(ids)


def unknown_run(cfg, run_id: str) -> str | None:
    """None when `run_id` is a known run; else the message: the root searched and the run ids it holds."""
    known = known_run_ids(cfg)
    if run_id in known:
        return None
    if not known:
        listing = "it holds no run"
    else:
        shown = known[-SHOWN:]
        listing = (f"known run ids ({len(known)}{f', the last {SHOWN}' if len(known) > SHOWN else ''}): "
                   + ", ".join(shown))
    return (f"--run-id {run_id}: no such run under run.output_root={cfg.run.output_root}; {listing}. Fix: check the "
            "run id, or pass the config (and overrides) the run used")
