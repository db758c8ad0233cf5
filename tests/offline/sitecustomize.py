"""No outbound connections: loaded by every Python process started with this folder on PYTHONPATH.

An audit hook fails any connect to an address that is not loopback (and any name lookup but this machine's own), and records the attempt
in `$LLM_PIPELINE_OUTBOUND_LOG` (one line per attempt, with the process and the address): an attempt the code under
test catches and logs (a telemetry sender does) is still seen by the test that reads the file.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import sys

_LOG = os.environ.get("LLM_PIPELINE_OUTBOUND_LOG")
# this machine's own name is local too: mindformers' trainer looks it up (gethostbyname(gethostname())) to name its
# node, an answer /etc/hosts gives; a lookup is refused only for other names
_LOCAL_NAMES = {"", "localhost", "localhost.localdomain", "ip6-localhost", socket.gethostname().lower()}


def _is_local(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).strip("[]").split("%", 1)[0].lower()
    if host in _LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name other than localhost: resolving it would ask a DNS server
    return address.is_loopback or address.is_unspecified  # 0.0.0.0: a bind-all listener, never a remote peer


def _refuse(what: str, host, port) -> None:
    line = f"pid {os.getpid()} {' '.join(sys.argv[:3])}: {what} {host!r}:{port!r}\n"
    if _LOG:
        try:
            with open(_LOG, "a", encoding="utf-8") as f:
                f.write(line)
        except OSError:
            pass
    raise ConnectionRefusedError(f"outbound connection refused by the test's guard: {what} {host!r}:{port!r}")


def _guard(event: str, args) -> None:
    if event == "socket.connect":
        sock, address = args
        if isinstance(address, tuple) and len(address) >= 2 and not _is_local(address[0]):
            _refuse("connect", address[0], address[1])
    elif event == "socket.getaddrinfo":
        host, port = args[0], args[1]
        if not _is_local(host):
            _refuse("getaddrinfo", host, port)
    elif event == "socket.gethostbyname" and not _is_local(args[0]):
        _refuse("gethostbyname", args[0], None)


sys.addaudithook(_guard)
