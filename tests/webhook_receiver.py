"""A real HTTP endpoint on 127.0.0.1 that records the JSON bodies POSTed to it (the failure webhook's receiver)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer


class WebhookReceiver:
    """`with WebhookReceiver() as hook:` ... `hook.url` to post to, `hook.received` the bodies, in order."""

    def __init__(self):
        received: list = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def __enter__(self) -> "WebhookReceiver":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
