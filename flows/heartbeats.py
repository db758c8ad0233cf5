"""Flow-run heartbeats that stop the moment their flow ends, for the flows a CLI runs in its own process.

Prefect sends a `prefect.flow-run.heartbeat` event per running flow every PREFECT_FLOWS_HEARTBEAT_FREQUENCY
seconds (180 by default in Prefect 3.9), so that a server automation can mark a run Crashed when its process
died without a word (SIGKILL, the OOM killer): docs/prefect-server.md, "Flow-run heartbeats". Its thread sleeps in
1-second steps and the end of each synchronous flow joins it: half a second of waiting per flow on average,
twice in a CLI run of one stage (the pipeline's flow and the stage's subflow), ~1 s of a 40 s data run.

`own_heartbeats()` (the CLI, around the flow it runs against a running server) turns Prefect's off and starts
one thread that sends the same events (the flow run as resource; its flow, deployment and tags as related) at
the same frequency for every flow run that `beating` registered (the decorator under each of our `@flow`s).
A flow's end only unregisters it: nothing waits. Where Prefect's own are on (a worker's process) or off (the
embedded server dies with the CLI, so a crash cannot outlive it), `beating` does nothing.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import threading
import time


class _Heartbeats:
    """One daemon thread sending a heartbeat for each registered flow run, every `every` seconds."""

    def __init__(self, every: float):
        self.every, self.runs, self.lock, self.wake = every, {}, threading.Lock(), threading.Event()
        self.stopped = False
        context = contextvars.copy_context()  # the API URL and auth the CLI set (as Prefect's own thread does)
        self.thread = threading.Thread(target=context.run, args=(self._loop,), name="flow-heartbeats", daemon=True)
        self.thread.start()

    def add(self, key, event: dict) -> None:
        """Send `event` now (Prefect sends one as the flow starts; emit_event only queues it) and every `every` s."""
        _send(event)
        with self.lock:
            self.runs[key] = (event, time.monotonic() + self.every)
        self.wake.set()

    def remove(self, key) -> None:
        with self.lock:
            self.runs.pop(key, None)

    def stop(self) -> None:
        self.stopped = True
        self.wake.set()

    def _loop(self) -> None:
        while not self.stopped:
            now = time.monotonic()
            with self.lock:
                due = [(key, event) for key, (event, at) in self.runs.items() if at <= now]
                for key, event in due:
                    self.runs[key] = (event, now + self.every)
                upcoming = min((at for _, at in self.runs.values()), default=now + self.every)
            for _, event in due:
                _send(event)
            self.wake.wait(max(upcoming - time.monotonic(), 0.0))
            self.wake.clear()


def _send(event: dict) -> None:
    from prefect.events.utilities import emit_event

    try:
        emit_event(**event)
    except Exception:  # a heartbeat lost is a heartbeat late: never the flow's failure
        pass


_ACTIVE: list[_Heartbeats] = []


def _event(flow_run, flow) -> dict:
    """The event Prefect's engine sends (flow_engine's heartbeat template): the flow run as resource."""
    from prefect import __version__
    from prefect.events.related import tags_as_related_resources

    related = [{"prefect.resource.id": f"prefect.flow.{flow_run.flow_id}", "prefect.resource.role": "flow",
                "prefect.resource.name": flow.name if flow else ""}]
    if flow_run.deployment_id:
        related.append({"prefect.resource.id": f"prefect.deployment.{flow_run.deployment_id}",
                        "prefect.resource.role": "deployment"})
    related += [dict(r) for r in tags_as_related_resources(set(flow_run.tags or []))]
    return {"event": "prefect.flow-run.heartbeat", "related": related,
            "resource": {"prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                         "prefect.resource.name": flow_run.name or "", "prefect.version": __version__}}


def beating(fn):
    """A flow function whose run sends heartbeats from own_heartbeats' thread while it runs, when the CLI started one."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        beats = _ACTIVE[-1] if _ACTIVE else None
        if beats is None:
            return fn(*args, **kwargs)
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if ctx is None or ctx.flow_run is None:
            return fn(*args, **kwargs)
        beats.add(ctx.flow_run.id, _event(ctx.flow_run, ctx.flow))
        try:
            return fn(*args, **kwargs)
        finally:
            beats.remove(ctx.flow_run.id)
    # resolved: Prefect reads the signature to validate parameters, and would look the annotations' names up here
    run.__signature__ = inspect.signature(fn, eval_str=True)
    return run


@contextlib.contextmanager
def own_heartbeats():
    """Within: Prefect's flow-run heartbeats off, ours (at the same frequency) on; nothing when they are off."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

    every = get_current_settings().flows.heartbeat_frequency
    if every is None:
        yield
        return
    beats = _Heartbeats(max(every, 30))  # Prefect's floor (flow_engine.MINIMUM_HEARTBEAT_INTERVAL)
    _ACTIVE.append(beats)
    try:
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield beats
    finally:
        _ACTIVE.remove(beats)
        beats.stop()
