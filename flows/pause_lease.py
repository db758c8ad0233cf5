"""A paused deployment run that keeps its deployment's concurrency slot and does not crash.

Why this exists (Prefect 3.9, read in its source): a worker moves a run of a deployment with a concurrency limit to
Pending, and the server takes a slot with a lease (core_policy.SecureFlowConcurrencySlots). The flow engine renews
that lease from a thread every 225 s (flow_engine: maintain_concurrency_lease(lease_id, 300,
raise_on_lease_renewal_failure=True), renewed at 0.75 of 300 s). When the run pauses, the server treats it as having
left Running: ReleaseFlowConcurrencySlots frees the slot and revokes the lease (only AwaitingRetry is exempt). The
engine's next renewal gets `410 Gone` and cancels the flow ("Concurrency lease renewal failed ... Terminating
execution"): the night crashes 0-225 s after pausing (94 s and 171 s were seen), whatever its pause timeout.

What a paused night does instead (`kept_slot_while_paused`): before pausing it stops the engine's renewal of the
lease the server is about to revoke (nothing renews a revoked lease), and once the run is Paused it takes its
deployment's slot again under a lease of its own (renewed by Prefect's `concurrency`, whose failure only warns), held
until the pause ends: a second run of the deployment waits for the slot (AwaitingConcurrencySlot), as it would for a
running night. Outside a deployment run with a concurrency limit it does nothing."""
from __future__ import annotations

import contextlib
import contextvars
import threading
from uuid import UUID

_RENEWAL_THREAD = "concurrency-lease-renewal-{}"  # prefect/concurrency/_leases.py names its thread so


def _stop_event_of(fn, depth: int = 0) -> threading.Event | None:
    """The threading.Event a renewal thread's function waits on (its `stop_event`), found through its closures."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, threading.Event):
            return value
        if callable(value) and depth < 3:
            found = _stop_event_of(value, depth + 1)
            if found is not None:
                return found
    return None


def stop_lease_renewal(lease_id: UUID | str) -> bool:
    """Stop the engine's renewal of `lease_id` (as its own context exit would); True when a renewal was stopped."""
    for thread in threading.enumerate():
        if thread.name == _RENEWAL_THREAD.format(lease_id):
            event = _stop_event_of(getattr(thread, "_target", None))
            if event is not None:
                event.set()
                return True
    return False


def _deployment_lease(flow_run_id) -> tuple[UUID | None, UUID | None]:
    """(deployment id, the run's deployment concurrency lease id) as the server has them now."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    details = run.state.state_details if run.state else None
    return run.deployment_id, (details.deployment_concurrency_lease_id if details else None)


def _hold_slot(flow_run_id, deployment_id, pause_over: threading.Event, log, poll_s: float) -> None:
    """Once the run is Paused (the server freed its slot), hold the deployment's slot until `pause_over`."""
    from prefect import get_client
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.concurrency.sync import concurrency

    while not pause_over.is_set():
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run_id).state
        if state is not None and state.is_paused():
            break
        pause_over.wait(poll_s)
    if pause_over.is_set():
        return
    try:
        # the slot may have gone to another run in the second since the pause: then this night waits without it
        with concurrency(f"deployment:{deployment_id}", occupy=1, timeout_seconds=30, strict=False,
                         raise_on_lease_renewal_failure=False,
                         holder=ConcurrencyLeaseHolder(type="flow_run", id=flow_run_id)):
            log("paused: holding the deployment's concurrency slot until the pause ends")
            pause_over.wait()
    except TimeoutError:
        log("paused: the deployment's concurrency slot went to another run while pausing; this night waits "
            "without it (a run started meanwhile finds the nightly lock and ends Busy)")


@contextlib.contextmanager
def kept_slot_while_paused(log=print, poll_s: float = 0.5):
    """Wrap a pause_flow_run of the current flow run (see the module's doc)."""
    from prefect.runtime import flow_run

    deployment_id, lease_id = _deployment_lease(flow_run.id)
    if deployment_id is None or lease_id is None:  # not a deployment run, or its deployment has no limit
        yield
        return
    if not stop_lease_renewal(lease_id):
        log(f"WARNING: this Prefect's renewal of the deployment lease {lease_id} was not found: a pause may still "
            "crash on it (flows/pause_lease.py reads Prefect 3.9's concurrency/_leases.py)")
    pause_over = threading.Event()
    holder = threading.Thread(target=contextvars.copy_context().run, daemon=True, name="nightly-paused-slot",
                              args=(_hold_slot, flow_run.id, deployment_id, pause_over, log, poll_s))
    holder.start()
    try:
        yield
    finally:
        pause_over.set()
        holder.join(10)
