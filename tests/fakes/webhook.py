"""A webhook receiver on 127.0.0.1 (an ephemeral port, in a thread) for the notifier's tests.

``pytest_plugins = ["fakes.webhook"]`` in a test module gives it the ``receiver`` fixture: one,
stopped after the test.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Receiver:
    """A webhook receiver: keeps every request; ``fail_next`` answers that many with 503; ``stop``/``start``
    take it off and back on the same port (connection refused in between)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.fail_next = 0
        #: (status, headers) to answer the next requests with, in order.
        self.answers: list[tuple[int, dict[str, str]]] = []
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.start()

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                code, headers = owner.judge(body), {}
                if owner.fail_next > 0:
                    owner.fail_next -= 1
                    code = 503
                elif owner.answers:
                    code, headers = owner.answers.pop(0)
                owner.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                       "at": time.time(), "code": code})
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def judge(self, body: dict) -> int:
        return 200

    def stop(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self, path: str = "/hook") -> list[dict]:
        return [r["body"] for r in self.requests if r["path"] == path]

    def delivered(self, path: str = "/hook") -> list[dict]:
        """What a receiver that dedupes on Idempotency-Key keeps."""
        seen, out = set(), []
        for r in self.requests:
            key = r["headers"].get("Idempotency-Key")
            if r["path"] == path and key not in seen:
                seen.add(key)
                out.append(r["body"])
        return out


@pytest.fixture
def receiver():
    rx = Receiver()
    yield rx
    if rx.server is not None:
        rx.stop()
