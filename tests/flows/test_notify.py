"""The failure webhook against real HTTP servers on 127.0.0.1: delivered, redirected, dripping, refused."""
from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flows.notify import _post


class _Server:
    def __init__(self, handler):
        self.hits: list[tuple[str, str]] = []
        outer = self

        class H(handler):
            def log_message(self, *a):
                pass

            def record(self):
                outer.hits.append((self.command, self.path))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self):
        self.record()
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()

    do_GET = do_POST


class _Redirect(BaseHTTPRequestHandler):
    target = ""

    def do_POST(self):
        self.record()
        self.send_response(302)
        self.send_header("Location", _Redirect.target)
        self.end_headers()


@pytest.fixture
def servers():
    made = []

    def make(handler):
        made.append(_Server(handler))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_delivered_notice_counts_and_a_redirect_is_not_followed(servers, capsys):
    ok, elsewhere = servers(_Ok), servers(_Ok)
    assert _post(ok.url + "/hook/T0KEN", {"x": 1}) is True and ok.hits == [("POST", "/hook/T0KEN")]
    _Redirect.target = elsewhere.url + "/collect"
    redirecting = servers(_Redirect)
    assert _post(redirecting.url + "/hook/T0KEN", {"x": 1}) is False
    assert elsewhere.hits == []  # never resent to where the 302 pointed
    out = capsys.readouterr().out
    assert "HTTP 302" in out and "T0KEN" not in out


def test_a_server_dripping_headers_cannot_hold_the_run_past_the_deadline():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def drip():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.is_set():  # one header byte every second: each read is within the socket timeout
            try:
                conn.sendall(b"X")
            except OSError:
                break
            time.sleep(1)
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    started = time.monotonic()
    try:
        assert _post(f"http://127.0.0.1:{listener.getsockname()[1]}/hook", {"x": 1}, deadline_s=2.0) is False
    finally:
        stop.set()
        listener.close()
    assert time.monotonic() - started < 2.0 + 1.5  # the header bytes alone would keep urllib reading forever


def test_a_non_http_url_is_never_opened(tmp_path, capsys):
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0")
    assert _post(f"file://{target}", {"x": 1}) is False
    assert _post("T0KEN-without-scheme", {"x": 1}) is False
    out = capsys.readouterr().out
    assert "not posted" in out and "T0KEN" not in out and str(target) not in out
