"""An HTTP endpoint for the ``to-http`` tests: records every request, answers 200.

A stdlib threading server (keep-alive, HTTP/1.1), so a Go tool and ours can
both be pointed at it from subprocesses.  It records the method, target,
headers and body of each request, how many were under way at once at most
(``-n``), and can hold each answer ``delay`` seconds or answer ``status``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    delay: float = 0.0
    status: int = 200
    requests: list[Seen] = field(default_factory=list)
    under_way: int = 0
    most_at_once: int = 0
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [r.body for r in self.requests]


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with recorder.lock:
                recorder.under_way += 1
                recorder.most_at_once = max(recorder.most_at_once, recorder.under_way)
            try:
                if recorder.delay:
                    recorder.release.wait(recorder.delay)
                with recorder.lock:
                    recorder.requests.append(
                        Seen(self.command, self.path, dict(self.headers.items()), body)
                    )
            finally:
                with recorder.lock:
                    recorder.under_way -= 1
            self.send_response(recorder.status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        do_GET = _serve
        do_POST = _serve

    return Handler


@contextmanager
def recording(delay: float = 0.0, status: int = 200) -> Iterator[Recorder]:
    recorder = Recorder(delay=delay, status=status)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorder))
    server.daemon_threads = True
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.release.set()
        server.shutdown()
        server.server_close()
