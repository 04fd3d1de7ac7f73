"""Request routing as nsqd's and nsqlookupd's ``httprouter`` does it.

Both daemons serve their APIs through julienschmidt/httprouter v1.3 with
``HandleMethodNotAllowed`` on, so what a client sees for a path that is not
quite right is the router's doing, not the handlers':

- a route matches on the exact (unescaped) path and method; ``:name`` segments
  match one non-empty segment, given to the handler in ``request.params``;
- no match, but the path with its trailing slash added or removed would match
  (same method): a redirect there (``RedirectTrailingSlash``);
- else a redirect to the cleaned, case-insensitively matching path, if any
  (``RedirectFixedPath``: ``//Stats/`` leads to ``/stats``);
- redirects are 301 for GET, 307 for other methods (not for CONNECT, not for
  ``/``), written by Go's ``http.Redirect`` (a tiny HTML body for GET);
- OPTIONS of a routed path: 200 with ``Allow`` and nothing else;
- another method of a routed path: the ``method_not_allowed`` answer with
  ``Allow`` (the methods, ``OPTIONS`` included, sorted);
- anything else: the ``not_found`` answer.

HEAD is a method like any other: no route answers it.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote

from .server import Request, Response

__all__ = ["Router", "Route", "clean_path"]

log = logging.getLogger(__name__)

RouteHandler = Callable[[Request], Awaitable[Response]]
ErrorAnswer = Callable[[Request], Response]

# Go's url.PathEscape-style set for a path (shouldEscape with encodePath).
_PATH_SAFE = "-_.~$&+,/:;=@"


@dataclass(frozen=True)
class Route:
    """One registered ``method path`` with its handler."""

    method: str
    pattern: str
    handler: RouteHandler

    @property
    def segments(self) -> list[str]:
        return self.pattern.split("/")

    def match(self, path: str, *, ignore_case: bool = False) -> dict[str, str] | None:
        """The route's params when ``path`` matches (``None`` when not)."""
        want = self.segments
        got = path.split("/")
        if len(want) != len(got):
            return None
        params: dict[str, str] = {}
        for pattern, part in zip(want, got, strict=True):
            if pattern.startswith(":"):
                if not part:
                    return None
                params[pattern[1:]] = part
            elif pattern != part and not (ignore_case and pattern.lower() == part.lower()):
                return None
        return params

    def fixed(self, path: str) -> str:
        """``path`` (which matches case-insensitively) in the route's own case."""
        return "/".join(
            part if pattern.startswith(":") else pattern
            for pattern, part in zip(self.segments, path.split("/"), strict=True)
        )


_SLASHES = re.compile("/{2,}")


def clean_path(path: str) -> str:
    """httprouter's ``CleanPath``: ``path.Clean`` that keeps a trailing slash
    and always starts with ``/``."""
    if not path:
        return "/"
    trailing = path.endswith("/") and path != "/"
    parts: list[str] = []
    for part in _SLASHES.sub("/", "/" + path).split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    cleaned = "/" + "/".join(parts)
    if trailing and cleaned != "/":
        cleaned += "/"
    return cleaned


def _toggle_slash(path: str) -> str:
    return path[:-1] if path.endswith("/") else path + "/"


class Router:
    """Routes for one server; :meth:`handle` is its request handler."""

    def __init__(self, *, not_found: ErrorAnswer, method_not_allowed: ErrorAnswer) -> None:
        self._routes: dict[str, list[Route]] = {}
        self._not_found = not_found
        self._method_not_allowed = method_not_allowed

    def add(self, method: str, pattern: str, handler: RouteHandler) -> None:
        """Route ``method pattern`` (``/config/:opt``) to ``handler``."""
        self._routes.setdefault(method, []).append(Route(method, pattern, handler))

    def routes(self) -> list[Route]:
        return [route for routes in self._routes.values() for route in routes]

    def _lookup(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        for route in self._routes.get(method, ()):
            params = route.match(path)
            if params is not None:
                return route, params
        return None

    def _fixed_path(self, method: str, path: str) -> str | None:
        """findCaseInsensitivePath(CleanPath(path), true)."""
        cleaned = clean_path(path)
        for candidate in (cleaned, _toggle_slash(cleaned) if cleaned != "/" else None):
            if candidate is None:
                continue
            for route in self._routes.get(method, ()):
                if route.match(candidate, ignore_case=True) is not None:
                    return route.fixed(candidate)
        return None

    def allowed(self, path: str, method: str) -> str:
        """The ``Allow`` header for ``path`` (other methods than ``method``; every
        method for the server-wide ``*``), or ''."""
        if path == "*":
            methods = [m for m in self._routes if m != "OPTIONS"]
        else:
            methods = [
                m
                for m in self._routes
                if m not in (method, "OPTIONS") and self._lookup(m, path) is not None
            ]
        if not methods:
            return ""
        return ", ".join(sorted([*methods, "OPTIONS"]))

    async def handle(self, request: Request) -> Response:
        path = request.path
        method = request.method
        if method in self._routes:
            found = self._lookup(method, path)
            if found is not None:
                route, params = found
                request.params = params
                return await route.handler(request)
            if method != "CONNECT" and path != "/":
                code = 301 if method == "GET" else 307
                if path != "/" and self._lookup(method, _toggle_slash(path)) is not None:
                    return redirect(request, _toggle_slash(path), code)
                fixed = self._fixed_path(method, path)
                if fixed is not None:
                    return redirect(request, fixed, code)
        if method == "OPTIONS":
            allow = self.allowed(path, method)
            if allow:
                return Response(200, b"", [("Allow", allow)])
        else:
            allow = self.allowed(path, method)
            if allow:
                response = self._method_not_allowed(request)
                response.headers.insert(0, ("Allow", allow))
                return response
        return self._not_found(request)


def redirect(request: Request, path: str, code: int) -> Response:
    """Go's ``http.Redirect(w, r, path+query, code)`` for a same-host path."""
    target = clean_path(quote(path, safe=_PATH_SAFE))
    if path.endswith("/") and not target.endswith("/"):
        target += "/"
    if request.raw_query:
        target += "?" + request.raw_query
    headers = [("Location", target)]
    body = b""
    if request.method in ("GET", "HEAD"):
        headers.append(("Content-Type", "text/html; charset=utf-8"))
    if request.method == "GET":
        text = _STATUS_TEXT.get(code, "")
        body = f'<a href="{_html_escape(target)}">{text}</a>.\n\n'.encode()
    return Response(code, body, headers)


_STATUS_TEXT = {301: "Moved Permanently", 307: "Temporary Redirect"}


def _html_escape(text: str) -> str:
    # Go's html.EscapeString: & ' < > " (the quotes as numeric references).
    return html.escape(text, quote=False).replace('"', "&#34;").replace("'", "&#39;")
