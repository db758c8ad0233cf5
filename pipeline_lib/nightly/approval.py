"""Who approved a held-back night: a name typed into the Prefect form is not an identity.

The self-hosted Prefect server (this product's) has no user accounts: anyone who can reach its API with its
credential (the UI, `prefect flow-run resume`) can answer the night's form, and the `who` field is free text. So the
state records `unverified: <name>` unless the server named the account that answered (`identity`: Prefect Cloud's
user or service account, where a server has one), and says which (`verified`). docs/nightly.md says who can approve.
"""
from __future__ import annotations

import datetime as dt


def decided_by(given: str, reason: str, asked_at: str, identity: str | None = None) -> dict:
    """The state's `decided_by` of an answered form (see the module docstring)."""
    name = " ".join(str(given or "").split())[:200] or "(not given)"
    return {"who": identity if identity else f"unverified: {name}", "verified": bool(identity),
            "given_name": name, "reason": reason, "asked_at": asked_at,
            "at": dt.datetime.now(dt.timezone.utc).isoformat()}
