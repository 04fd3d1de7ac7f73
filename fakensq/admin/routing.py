"""Request routing with the rules of nsqadmin's router (julienschmidt/httprouter).

Scripts meet these rules at the edges: ``/api/topics/`` is redirected (301) to
``/api/topics``, ``/API/Topics`` and ``/api//topics`` to the cleaned path; a known
path with the wrong method gets 405 and an ``Allow`` header; ``OPTIONS`` answers
the ``Allow`` header; anything else is 404.  Paths are matched decoded, as Go's
``URL.Path`` is, so ``%2F`` separates segments.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

from ..httpserver import Request, Response

__all__ = ["Router", "Handler", "clean_path"]

Handler = Callable[[Request, dict[str, str]], Awaitable[Response]]


@dataclass(frozen=True)
class _Route:
    method: str
    segments: tuple[str, ...]
    handler: Handler

    def match(self, parts: list[str], *, fold: bool = False) -> dict[str, str] | None:
        """The route's parameters if ``parts`` fits it (``fold``: literal segments
        compared case-insensitively), else None."""
        if self.segments and self.segments[-1].startswith("*"):
            head = self.segments[:-1]
            if len(parts) <= len(head):
                return None
            params = self._fit(head, parts[: len(head)], fold)
            if params is not None:
                params[self.segments[-1][1:]] = "/".join(parts[len(head) :])
            return params
        if len(parts) != len(self.segments):
            return None
        return self._fit(self.segments, parts, fold)

    @staticmethod
    def _fit(segments: tuple[str, ...], parts: list[str], fold: bool) -> dict[str, str] | None:
        params: dict[str, str] = {}
        for seg, part in zip(segments, parts, strict=True):
            if seg.startswith(":"):
                if not part:
                    return None
                params[seg[1:]] = part
            elif seg != part and not (fold and seg.lower() == part.lower()):
                return None
        return params

    def path_for(self, parts: list[str]) -> str:
        """The route's own spelling of a case-folded match."""
        out = [
            part if seg.startswith((":", "*")) else seg
            for seg, part in zip(self.segments, parts, strict=False)
        ]
        out += parts[len(self.segments) :]
        return "/" + "/".join(out)


def _split(path: str) -> list[str]:
    return path.strip("/").split("/") if path.strip("/") else []


def clean_path(path: str) -> str:
    """Go's ``path.Clean`` for a URL path (keeps a trailing slash, as httprouter's
    ``CleanPath`` does)."""
    parts: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts:
                parts.pop()
            continue
        parts.append(segment)
    cleaned = "/" + "/".join(parts)
    if path.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


class Router:
    """Routes by method and path pattern (``/api/topics/:topic``, ``/live/*path``)."""

    def __init__(self, not_found: Handler) -> None:
        self.routes: list[_Route] = []
        self.not_found = not_found

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        self.routes.append(_Route(method, tuple(_split(pattern)), handler))

    def _find(
        self, method: str, path: str, *, fold: bool = False
    ) -> tuple[_Route, dict[str, str]] | None:
        parts = _split(path)
        for route in self.routes:
            if route.method != method:
                continue
            params = route.match(parts, fold=fold)
            if params is not None:
                return route, params
        return None

    def _allowed(self, path: str, method: str) -> list[str]:
        methods = {r.method for r in self.routes if r.method != method}
        allowed = sorted(m for m in methods if self._find(m, path) is not None)
        return [*allowed, "OPTIONS"] if allowed else []

    async def route(self, request: Request) -> Response:
        path = unquote(request.path)
        trailing = path != "/" and path.endswith("/")
        if not trailing:
            found = self._find(request.method, path)
            if found is not None:
                route, params = found
                return await route.handler(request, params)
        if any(r.method == request.method for r in self.routes) and request.method != "CONNECT":
            redirect = self._redirect(request.method, path, trailing)
            if redirect is not None:
                return _redirect(request, redirect)
        if request.method == "OPTIONS":
            allowed = self._allowed(path, "OPTIONS")
            if allowed:
                return Response(200, b"", [("Allow", ", ".join(allowed))])
        else:
            allowed = self._allowed(path, request.method)
            if allowed:
                response = await self.not_found(request, {"status": "405"})
                response.headers.append(("Allow", ", ".join(allowed)))
                return response
        return await self.not_found(request, {})

    def _redirect(self, method: str, path: str, trailing: bool) -> str | None:
        if path == "/":
            return None
        if trailing and self._find(method, path.rstrip("/") or "/") is not None:
            return path.rstrip("/")
        cleaned = clean_path(path).rstrip("/") or "/"
        found = self._find(method, cleaned, fold=True)
        if found is not None:
            fixed = found[0].path_for(_split(cleaned))
            if fixed != path:
                return fixed
        return None


def _redirect(request: Request, location: str) -> Response:
    target = location + (f"?{request.raw_query}" if request.raw_query else "")
    if request.method == "GET":
        body = f'<a href="{target}">Moved Permanently</a>.\n\n'.encode()
        return Response(
            301, body, [("Location", target), ("Content-Type", "text/html; charset=utf-8")]
        )
    return Response(307, b"", [("Location", target)])
