"""A small auth server for nsqd's ``--auth-http-address`` (the real nsqd's and
fakensq's alike ask it over HTTP), serving on a thread of its own: Trio,
blocking and asyncio tests use it the same way.

``grants`` maps a secret to what to answer when nsqd asks about it:

- a list of permissions (``["subscribe", "publish"]``): a document granting
  them on every topic and channel (identity ``tester``, TTL one hour);
- a dict: that JSON document, as it is;
- a ``str`` or ``bytes``: that body, as text (a broken answer);
- an ``int``: that HTTP status, with no grant.

Secrets it does not know get 403.  ``queries`` records each request as nsqd
sent it (method, path, raw query, user agent, accept header, body), to compare
what two nsqds send; ``seen`` is the secrets asked about, in order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

__all__ = ["AuthServer", "grant_all", "running_auth_server"]

#: The identity of a grant given as a list of permissions.
IDENTITY = "tester"


def grant_all(permissions: list[str], *, ttl: int = 3600) -> dict[str, Any]:
    """nsqd's auth document granting ``permissions`` on every topic and channel."""
    return {
        "ttl": ttl,
        "identity": IDENTITY,
        "identity_url": "",
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": permissions}],
    }


class AuthServer:
    """Answers ``GET /auth`` from :attr:`grants` (see the module doc), on
    127.0.0.1 (:attr:`address`), from construction until :meth:`close`."""

    def __init__(self, grants: dict[str, Any] | None = None) -> None:
        self.grants: dict[str, Any] = dict(grants or {})
        #: every request received, in order
        self.queries: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer._answer(self)

            do_POST = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        # (a short poll interval: close() waits for the serving loop to look)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="auth-server", daemon=True
        )
        self._thread.start()

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        url = urlparse(request.path)
        length = int(request.headers.get("content-length") or 0)
        self.queries.append(
            {
                "method": request.command,
                "path": url.path,
                "query": url.query,  # its order and escaping too
                "user-agent": request.headers.get("user-agent", ""),
                "accept": request.headers.get("accept", ""),
                "body": request.rfile.read(length) if length else b"",
            }
        )
        secret = parse_qs(url.query).get("secret", [""])[0]
        grant = self.grants.get(secret, 403)
        if isinstance(grant, int):
            status, body, kind = grant, b'{"message":"NO"}', "application/json; charset=utf-8"
        elif isinstance(grant, str | bytes):
            text = grant.encode() if isinstance(grant, str) else grant
            status, body, kind = 200, text, "text/plain; charset=utf-8"
        else:
            document = grant_all(grant) if isinstance(grant, list) else grant
            status, body, kind = 200, json.dumps(document).encode(), "application/json"
        request.send_response(status)
        request.send_header("Content-Type", kind)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    @property
    def seen(self) -> list[str]:
        """The secrets asked about, in order."""
        return [parse_qs(q["query"]).get("secret", [""])[0] for q in self.queries]

    def close(self) -> None:
        """Stop serving (blocks until the serving thread has ended)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@contextmanager
def running_auth_server(grants: dict[str, Any] | None = None) -> Iterator[AuthServer]:
    """An :class:`AuthServer`, closed on leaving."""
    server = AuthServer(grants)
    try:
        yield server
    finally:
        server.close()
