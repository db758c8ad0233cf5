"""A fault-injecting HTTP proxy in front of an S3 server (moto), for the storage-fault tests (issue 16).

    proxy = FaultProxy("http://127.0.0.1:5000").start()      # proxy.url is the endpoint to give the client
    proxy.add(Fault("slowdown", method="PUT", key=r"/data/manifest\\.json$", nth=1))
    proxy.add(Fault("reset_response", probability=0.05, seed=7))
    ...
    proxy.injected  # [(kind, method, path), ...] every fault actually delivered

Every request is read whole, forwarded to the upstream server on a fresh connection and its answer sent
back (keep-alive towards the client), unless a rule fires first. Kinds:
  slowdown        answer 503 SlowDown (S3's XML error) without forwarding: the server never sees it;
  reset_request   read half the request body, then reset the connection (RST): the server never sees it;
  stall           read half the request body, then stop reading for `stall_s` seconds (longer than the
                  client's read timeout), then close: the server never sees it;
  reset_response  forward (the server DOES apply it), then send the status, headers and half the body
                  and reset: the client loses the answer to a request that happened (the lost ack);
  short_read      forward, then send the headers with the full Content-Length but only half the body and
                  close cleanly (FIN): a body shorter than it says (give it method="GET": other answers
                  have no body to cut).
A rule matches by method (None: any) and a regex searched in the request path (None: any); it fires on
its `nth` match (1-based) or, with `probability`, on each match with that chance from its own seeded
random stream; at most `times` times (None: no limit).
"""
from __future__ import annotations

import http.client
import random
import re
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KINDS = ("slowdown", "reset_request", "stall", "reset_response", "short_read")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
              "expect", "content-length"}
SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 b"<Message>Please reduce your request rate.</Message></Error>")


@dataclass
class Fault:
    kind: str
    method: str | None = None
    key: str | None = None           # regex searched in the request path ("/bucket/key?query")
    nth: int | None = None           # fire on the nth matching request ...
    probability: float | None = None  # ... or on each with this chance (seeded)
    seed: int = 0
    times: int | None = 1            # at most this many injections (None: unlimited)
    stall_s: float = 3.0
    seen: int = 0
    fired: int = 0
    _rng: random.Random = field(default=None, repr=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r}: use one of {KINDS}")
        if self.nth is None and self.probability is None:
            self.nth = 1
        if self.probability is not None and self.nth is None and self.times == 1:
            self.times = None
        self._rng = random.Random(self.seed)

    def fires(self, method: str, path: str) -> bool:
        if self.method and method != self.method:
            return False
        if self.key and not re.search(self.key, urllib.parse.unquote(path)):
            return False
        self.seen += 1
        if self.times is not None and self.fired >= self.times:
            return False
        hit = self.seen == self.nth if self.nth is not None else self._rng.random() < self.probability
        self.fired += hit
        return hit


class FaultProxy:
    def __init__(self, upstream: str):
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname, parsed.port or 80)
        self.rules: list[Fault] = []
        self.injected: list[tuple[str, str, str]] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- control -----------------------------------------------------------------------------------
    def start(self) -> "FaultProxy":
        proxy = self

        class Handler(_Handler):
            pass

        Handler.proxy = proxy
        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, *faults: Fault) -> "FaultProxy":
        with self._lock:
            self.rules.extend(faults)
        return self

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def pick(self, method: str, path: str) -> Fault | None:
        with self._lock:
            self.requests += 1
            for rule in self.rules:
                if rule.fires(method, path):
                    self.injected.append((rule.kind, method, path))
                    return rule
        return None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that gave up on a stalled request: expected
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and Expect: 100-continue, as a real S3 endpoint
    # An answer goes out as two writes (head, then body): with Nagle's algorithm the body waited for the client's
    # delayed ACK of the head, 40 ms on every GET and list through the proxy (6 ms straight to moto), hundreds of
    # times a data stage. Real S3 endpoints send without that stall.
    disable_nagle_algorithm = True
    proxy: FaultProxy

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self._serve()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _serve(self):
        fault = self.proxy.pick(self.command, self.path)
        kind = fault.kind if fault else None
        length = int(self.headers.get("Content-Length") or 0)
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        if kind in ("reset_request", "stall"):
            self.rfile.read(length // 2) if length else None
            if kind == "stall":
                time.sleep(fault.stall_s)
            return self._reset()
        body = self._read_chunked() if chunked else (self.rfile.read(length) if length else b"")
        if kind == "slowdown":
            return self._answer(503, [("Content-Type", "application/xml")], SLOWDOWN_BODY)
        status, headers, payload = self._forward(body)
        if kind == "reset_response":
            if payload:
                self._send_head(status, headers, len(payload))
                self.wfile.write(payload[:len(payload) // 2])
            else:  # nothing after the headers to cut: cut the status line instead
                self.wfile.write(f"{self.protocol_version} {status} ".encode())
            self.wfile.flush()
            return self._reset()
        if kind == "short_read":
            self._send_head(status, headers, len(payload))
            self.wfile.write(payload[:len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send_head(status, headers, len(payload), head_length=self.command == "HEAD")
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _read_chunked(self) -> bytes:
        out = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return out
            out += self.rfile.read(size)
            self.rfile.readline()

    def _forward(self, body: bytes):
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
            if self.command == "HEAD":  # no body: keep the object's length as the server said it
                kept.append(("Content-Length", resp.getheader("Content-Length") or "0"))
            return resp.status, kept, payload
        finally:
            conn.close()

    def _send_head(self, status: int, headers, length: int, head_length: bool = False) -> None:
        self.send_response_only(status)
        for k, v in headers:
            self.send_header(k, v)
        if not head_length:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _answer(self, status: int, headers, payload: bytes) -> None:
        self._send_head(status, headers, len(payload))
        self.wfile.write(payload)

    def _reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed peer or a middlebox would."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass
