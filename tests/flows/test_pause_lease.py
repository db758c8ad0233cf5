"""flows/pause_lease.py reaches into Prefect 3.9's lease renewal (its thread's name and the stop event in its
closures): on a real lease of the session's server, stop_lease_renewal finds that renewal and ends it, as the
engine's own exit does. When a Prefect upgrade changes either, this fails here, in seconds, not in a paused night."""
from __future__ import annotations

import threading
import uuid

import pytest

from flows.pause_lease import stop_lease_renewal

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_the_engines_lease_renewal_is_found_and_stopped():
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency._leases import maintain_concurrency_lease

    name = f"pause-lease-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        lease_id = client.increment_concurrency_slots_with_lease([name], 1, "concurrency", 60).json()["lease_id"]
        try:
            assert not stop_lease_renewal(lease_id)  # no renewal of it yet: nothing stopped
            # what the flow engine does for a deployment's lease (flow_engine.py: maintain_concurrency_lease(...))
            with maintain_concurrency_lease(uuid.UUID(lease_id), 60, raise_on_lease_renewal_failure=True):
                renewal = [t for t in threading.enumerate() if t.name == f"concurrency-lease-renewal-{lease_id}"]
                assert len(renewal) == 1
                assert stop_lease_renewal(lease_id)
                renewal[0].join(5)
                assert not renewal[0].is_alive()  # ended without renewing again (its next renewal was 45 s away)
        finally:
            client.delete_global_concurrency_limit_by_name(name)
