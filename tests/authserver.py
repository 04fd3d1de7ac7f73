"""A small auth server for nsqd's ``--auth-http-address``, on a thread of its
own (the real nsqd asks it over HTTP, as fakensq does)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

__all__ = ["AuthServer"]


class AuthServer:
    """``GET /auth`` with the client's secret, answered from ``grants`` (secret
    -> permissions on every topic and channel; other secrets get 403).  Serves
    from construction until :meth:`close`."""

    def __init__(self, grants: dict[str, list[str]]) -> None:
        self.grants = grants
        #: every query received, in order
        self.queries: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                outer.queries.append(query)
                permissions = outer.grants.get(query.get("secret", ""))
                if url.path != "/auth" or permissions is None:
                    self.send_response(403)
                    self.end_headers()
                    return
                body = json.dumps(
                    {
                        "ttl": 3600,
                        "identity": "tester",
                        "identity_url": "",
                        "authorizations": [
                            {"topic": ".*", "channels": [".*"], "permissions": permissions}
                        ],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def seen(self) -> list[str]:
        """The secrets asked about, in order."""
        return [query.get("secret", "") for query in self.queries]

    def close(self) -> None:
        """Stop serving (blocks until the serving thread has ended)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
