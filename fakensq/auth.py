"""nsqd's authorization: the auth server protocol and permission checks.

With ``auth_http_addresses`` set, clients must AUTH with a secret; nsqd asks an
auth server ``GET /auth?remote_ip=&tls=&secret=`` (and ``common_name`` with a TLS
client certificate) and gets the client's identity, a TTL and authorizations.
Tests may instead give ``NSQD(auth_handler=...)``, a Python callable taking the
same query (a dict) and returning the same JSON (a dict), sync or async.
nsqd's HTTP timeouts (http_client_connect_timeout / request_timeout) apply to
the HTTP servers only: a handler that never returns makes AUTH hang.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["AuthHandler", "Authorization", "AuthState", "query_auth", "AuthError"]

#: ``handler(query) -> response``: query has remote_ip, tls, secret (and
#: common_name); the response is the auth server's JSON document.
AuthHandler = Callable[[dict[str, str]], "Mapping[str, Any] | Awaitable[Mapping[str, Any]]"]


class AuthError(Exception):
    """The auth server could not be asked, or answered something unusable."""


@dataclass
class Authorization:
    topic: str
    channels: list[str]
    permissions: list[str]

    def has_permission(self, permission: str) -> bool:
        return permission in self.permissions

    def is_allowed(self, topic: str, channel: str) -> bool:
        """nsqd's ``IsAllowed``: Go's ``MatchString`` is an unanchored search."""
        if not self.has_permission("subscribe" if channel else "publish"):
            return False
        if re.search(self.topic, topic) is None:
            return False
        return any(re.search(c, channel) is not None for c in self.channels)


@dataclass
class AuthState:
    identity: str = ""
    identity_url: str = ""
    ttl: int = 0
    expires: float = 0.0  # trio clock
    authorizations: list[Authorization] = field(default_factory=list)

    def is_allowed(self, topic: str, channel: str) -> bool:
        return any(a.is_allowed(topic, channel) for a in self.authorizations)


def parse_auth_response(doc: Any) -> AuthState:
    """Validate the auth server's answer as nsqd does."""
    if not isinstance(doc, Mapping):
        raise AuthError("auth response is not a JSON object")
    try:
        ttl = int(doc.get("ttl", 0))
        auths: list[Authorization] = []
        for raw in doc.get("authorizations") or []:
            auth = Authorization(
                topic=str(raw.get("topic", "")),
                channels=[str(c) for c in raw.get("channels") or []],
                permissions=[str(p) for p in raw.get("permissions") or []],
            )
            for p in auth.permissions:
                if p not in ("subscribe", "publish"):
                    raise AuthError(f"unknown permission {p}")
            for pattern in (auth.topic, *auth.channels):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise AuthError(f"unable to compile {pattern!r} {exc}") from None
            auths.append(auth)
    except (TypeError, ValueError, AttributeError) as exc:
        raise AuthError(f"invalid auth response: {exc}") from None
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(
        identity=str(doc.get("identity", "")),
        identity_url=str(doc.get("identity_url", "")),
        ttl=ttl,
        authorizations=auths,
    )


async def query_auth(
    addresses: list[str],
    handler: AuthHandler | None,
    query: dict[str, str],
    *,
    method: str = "get",
    connect_timeout: float = 2.0,
    request_timeout: float = 5.0,
) -> AuthState:
    """Ask the handler, or each auth server in turn until one answers."""
    if handler is not None:
        try:
            result = handler(dict(query))
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            raise AuthError(f"auth handler failed: {exc}") from exc
        return parse_auth_response(result)
    last: Exception | None = None
    timeout = httpx.Timeout(request_timeout, connect=connect_timeout)
    for address in addresses:
        url = address if "://" in address else f"http://{address}"
        try:
            async with httpx.AsyncClient(timeout=timeout) as http:
                if method.lower() == "post":
                    resp = await http.post(f"{url}/auth", data=query)
                else:
                    resp = await http.get(f"{url}/auth", params=query)
            if resp.status_code != 200:
                raise AuthError(f"got response {resp.status_code} from {url}")
            return parse_auth_response(json.loads(resp.content))
        except (httpx.HTTPError, ValueError, AuthError) as exc:
            last = exc
    raise AuthError(f"unable to access auth server: {last}")
