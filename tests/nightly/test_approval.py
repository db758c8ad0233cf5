"""The held-night approval records an identity only where the server gave one (issue 45 item 11)."""
from pipeline_lib.nightly.approval import decided_by


def test_a_typed_name_is_recorded_as_unverified_and_a_server_identity_as_itself():
    by = decided_by("  alice\n(admin) ", "checked it", "2026-12-02T02:00:00+00:00")
    assert by["who"] == "unverified: alice (admin)" and by["verified"] is False and by["reason"] == "checked it"
    assert decided_by("", "", "t")["who"] == "unverified: (not given)"
    by = decided_by("alice", "ok", "t", identity="user:alice@example.com")
    assert by["who"] == "user:alice@example.com" and by["verified"] is True and by["given_name"] == "alice"
