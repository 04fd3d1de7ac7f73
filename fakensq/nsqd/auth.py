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

import functools
import inspect
import json
import logging
import random
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

import httpx
import trio

from trionsq.protocol.errors import (
    AuthDisabledError,
    AuthFailedError,
    AuthFirstError,
    InvalidError,
    UnauthorizedError,
)
from trionsq.protocol.identify import AuthResponse
from trionsq.protocol.names import go_quote

from ..golang.json import value_kind
from .options import NSQDOptions

__all__ = [
    "AuthOwner",
    "ClientAuth",
    "AuthHandler",
    "Authorization",
    "AuthState",
    "query_auth",
    "auth_query_string",
    "decode_auth_response",
    "AuthError",
]

#: ``handler(query) -> response``: query has remote_ip, tls, secret (and
#: common_name); the response is the auth server's JSON document.
AuthHandler = Callable[[dict[str, str]], "Mapping[str, Any] | Awaitable[Mapping[str, Any]]"]


class AuthError(Exception):
    """The auth server could not be asked, or answered something unusable."""


log = logging.getLogger("fakensq.nsqd.client")


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


class _TypeError(Exception):
    """A JSON value Go's encoding/json would not put in the field's type."""


def _go_field(doc: Mapping[str, Any], name: str) -> Any:
    # Go matches a JSON key to a field exactly, else case-insensitively.
    if name in doc:
        return doc[name]
    for key, value in doc.items():
        if isinstance(key, str) and key.lower() == name:
            return value
    return None


def _go_string(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _TypeError(f"cannot unmarshal {value_kind(value)} into string")
    return value


def _go_strings(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _TypeError(f"cannot unmarshal {value_kind(value)} into []string")
    return [_go_string(item) for item in value]


def _go_int(value: Any) -> int:
    if value is None:
        return 0
    # A float here came from a literal with a fraction or an exponent, which
    # Go refuses for an int field.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _TypeError(f"cannot unmarshal {value_kind(value)} into int")
    if not -(1 << 63) <= value < (1 << 63):
        raise _TypeError("number out of range for int")
    return value


# RE2 (Go's regexp) has no lookaround and no backreferences; Python's re has.
_NOT_RE2 = re.compile(r"\\[1-9]|\\g<|\(\?(?:=|!|<=|<!|P=)")


def _compile_go_regexp(pattern: str) -> None:
    if _NOT_RE2.search(pattern):
        raise re.error("invalid or unsupported Perl syntax")
    re.compile(pattern)


def decode_auth_response(doc: Any) -> AuthState:
    """The auth server's answer, decoded as Go decodes it into nsqd's
    ``auth.State`` (a wrong type anywhere is an error; unknown keys are not)
    and validated as nsqd does; raises :class:`AuthError`."""
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise AuthError(f"json: cannot unmarshal {value_kind(doc)} into auth.State")
    try:
        ttl = _go_int(_go_field(doc, "ttl"))
        identity = _go_string(_go_field(doc, "identity"))
        identity_url = _go_string(_go_field(doc, "identity_url"))
        raw_auths = _go_field(doc, "authorizations")
        if raw_auths is not None and not isinstance(raw_auths, list):
            raise _TypeError(f"cannot unmarshal {value_kind(raw_auths)} into []Authorization")
        auths: list[Authorization] = []
        for raw in raw_auths or []:
            if raw is None:
                raw = {}
            if not isinstance(raw, Mapping):
                raise _TypeError(f"cannot unmarshal {value_kind(raw)} into Authorization")
            auths.append(
                Authorization(
                    topic=_go_string(_go_field(raw, "topic")),
                    channels=_go_strings(_go_field(raw, "channels")),
                    permissions=_go_strings(_go_field(raw, "permissions")),
                )
            )
    except _TypeError as exc:
        raise AuthError(f"json: {exc}") from None
    for auth in auths:
        for p in auth.permissions:
            if p not in ("subscribe", "publish"):
                raise AuthError(f"unknown permission {p}")
        for pattern in (auth.topic, *auth.channels):
            try:
                _compile_go_regexp(pattern)
            except re.error as exc:
                raise AuthError(f"unable to compile {pattern!r} {exc}") from None
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(identity=identity, identity_url=identity_url, ttl=ttl, authorizations=auths)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character in JSON: {name}")


def _loads(body: bytes) -> Any:
    return json.loads(body, parse_constant=_reject_constant)


#: What Go's net/http client sends with a request, and nothing more (an auth
#: server sees the same request from fakensq as from nsqd).
_GO_CLIENT_HEADERS = {
    "User-Agent": "Go-http-client/1.1",
    "Accept": "application/vnd.nsq; version=1.0",  # nsqd's http_api client adds it
    "Accept-Encoding": "gzip",
}


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # httpx's default context, built once: building it loads the CA bundle
    # (~0.1 s), which made every AUTH that slow.  Each query still has a client
    # (and a connection) of its own, as nsqd's.
    return httpx.create_ssl_context()


def auth_query_string(query: dict[str, str]) -> str:
    """Go's ``url.Values.Encode``: keys sorted, ``QueryEscape``-d values."""
    return urlencode(sorted(query.items()))


async def query_auth(
    addresses: list[str],
    handler: AuthHandler | None,
    query: dict[str, str],
    *,
    method: str = "get",
    connect_timeout: float = 2.0,
    request_timeout: float = 5.0,
    start: int = 0,
) -> AuthState:
    """Ask the handler, or the auth servers in turn from the ``start``-th (nsqd
    starts at a random one) until one answers."""
    if handler is not None:
        try:
            result = handler(dict(query))
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            raise AuthError(f"auth handler failed: {exc}") from exc
        return decode_auth_response(result)
    last: Exception | None = None
    timeout = httpx.Timeout(request_timeout, connect=connect_timeout)
    n = len(addresses)
    for i in range(n):
        address = addresses[(start + i) % n]
        url = address if "://" in address else f"http://{address}/auth"
        try:
            async with httpx.AsyncClient(
                timeout=timeout, headers=_GO_CLIENT_HEADERS, verify=_tls_context()
            ) as http:
                del http.headers["connection"]  # httpx's own; Go sends none
                if method.lower() == "post":
                    resp = await http.post(url, content=auth_query_string(query).encode())
                else:
                    resp = await http.get(f"{url}?{auth_query_string(query)}")
            if resp.status_code != 200:
                raise AuthError(f"got response {resp.status_code} from {url}")
            return decode_auth_response(_loads(resp.content))
        except (httpx.HTTPError, ValueError, AuthError) as exc:
            last = exc
    raise AuthError(f"unable to access auth server: {last}")


class AuthOwner(Protocol):
    """What a client's authorization asks of its nsqd."""

    @property
    def options(self) -> NSQDOptions: ...

    @property
    def rng(self) -> random.Random:
        """The seeded choice of the auth server asked first."""
        ...

    @property
    def auth_handler(self) -> AuthHandler | None: ...

    @property
    def auth_enabled(self) -> bool: ...


class ClientAuth:
    """One client's authorization: nsqd's AUTH command, and the checks before
    PUB, MPUB, DPUB and SUB (asking the auth server again once its TTL ran out).

    ``peer()`` gives what the auth server is told of the client besides its
    secret (``remote_ip``, ``tls``, ``common_name``), as it is at the time;
    ``who`` names the client in the log.  The errors raised are nsqd's.
    """

    def __init__(self, owner: AuthOwner, peer: Callable[[], dict[str, str]], who: str) -> None:
        self.owner = owner
        self.peer = peer
        self.who = who
        self.secret = ""
        #: what the auth server granted (None before AUTH)
        self.state: AuthState | None = None

    @property
    def authed(self) -> bool:
        return self.state is not None and bool(self.state.authorizations)

    async def authenticate(self, secret: bytes) -> AuthResponse:
        """AUTH: ask the auth server about ``secret``; nsqd's answer."""
        if self.authed:
            raise InvalidError("AUTH already set")
        if not self.owner.auth_enabled:
            raise AuthDisabledError("AUTH disabled")
        self.secret = secret.decode("utf-8", "surrogateescape")
        state = self.state = await self._ask()
        if not state.authorizations:
            raise UnauthorizedError("AUTH no authorizations found")
        return {
            "identity": state.identity,
            "identity_url": state.identity_url,
            "permission_count": len(state.authorizations),
        }

    async def check(self, verb: str, topic: str, channel: str) -> None:
        """nsqd's ``CheckAuth`` before ``verb`` on ``topic`` (and ``channel``)."""
        if not self.owner.auth_enabled:
            return
        state = self.state
        if state is None or not state.authorizations:
            raise AuthFirstError(f"AUTH required before {verb}")
        if trio.current_time() >= state.expires:
            state = self.state = await self._ask()
        if not state.is_allowed(topic, channel):
            raise UnauthorizedError(
                f"AUTH failed for {verb} on {go_quote(topic)} {go_quote(channel)}"
            )

    async def _ask(self) -> AuthState:
        opts = self.owner.options
        addresses = opts.auth_http_addresses
        try:
            state = await query_auth(
                addresses,
                self.owner.auth_handler,
                {**self.peer(), "secret": self.secret},
                method=opts.auth_http_request_method,
                connect_timeout=opts.http_client_connect_timeout,
                request_timeout=opts.http_client_request_timeout,
                start=self.owner.rng.randrange(len(addresses)) if addresses else 0,
            )
        except AuthError as exc:
            log.warning("client %s: AUTH failed %s", self.who, exc)
            raise AuthFailedError("AUTH failed") from None
        state.expires = trio.current_time() + state.ttl
        return state
