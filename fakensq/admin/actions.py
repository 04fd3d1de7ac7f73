"""The pages' actions on topics and channels (``/api/action``).

nsqadmin's actions, as its pages do them, reported node by node ("pause channel
orders/audit: OK on 127.0.0.1:4151, 127.0.0.1:4251", or which node failed and
why).  One difference, for a page people click: a topic created with no nsqd
producing it yet is created on every live nsqd, so that it exists somewhere
(nsqadmin's ``POST /api/topics`` only registers it with nsqlookupd, and
:mod:`fakensq.admin.api` does just that).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import trio

from .data import Snapshot

__all__ = ["ActionError", "PageActions"]


class ActionError(Exception):
    """An action that cannot be done (bad arguments, nothing to do it on)."""


class PageActions:
    """Topic and channel actions over ``client``; ``snapshot`` reads the cluster,
    ``lookupds`` gives the nsqlookupds' HTTP addresses."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        snapshot: Callable[[], Awaitable[Snapshot]],
        lookupds: Callable[[], list[str]],
    ) -> None:
        self.client = client
        self.snapshot = snapshot
        self.lookupds = lookupds

    async def act(self, action: str, args: dict[str, Any]) -> tuple[bool, str]:
        """Do ``action`` (``topic/pause``, ``channel/delete``...); (all went well,
        what happened).  Raises :class:`ActionError` for a request that makes no
        sense."""
        kind, _, verb = action.partition("/")
        if kind not in ("topic", "channel") or verb not in (
            "create",
            "delete",
            "empty",
            "pause",
            "unpause",
        ):
            raise ActionError(f"unknown action {action!r}")
        topic = str(args.get("topic") or "")
        channel = str(args.get("channel") or "")
        if not topic:
            raise ActionError("no topic given")
        if kind == "channel" and not channel:
            raise ActionError("no channel given")
        if kind == "topic" and verb == "create" and channel:
            # nsqadmin's create form makes the topic and, optionally, a channel in it.
            ok1, m1 = await self.act("topic/create", {"topic": topic})
            ok2, m2 = await self.act("channel/create", {"topic": topic, "channel": channel})
            return ok1 and ok2, f"{m1}; {m2}"

        query = "topic=" + quote(topic, safe="")
        if kind == "channel":
            query += "&channel=" + quote(channel, safe="")
        targets: list[str] = []
        if verb in ("create", "delete"):
            # As nsqadmin: lookupds first (registrations), then the producers.
            targets += [f"http://{a}/{kind}/{verb}?{query}" for a in self.lookupds()]
        snap = await self.snapshot()
        producers = snap.producers(topic)
        if not producers and kind == "topic" and verb == "create":
            # A new topic has no producer yet: make it on every live nsqd, so that
            # it is somewhere (nsqadmin would only register it with nsqlookupd).
            producers = [n.address for n in snap.nodes if n.up]
        targets += [f"http://{a}/{kind}/{verb}?{query}" for a in producers]
        if not targets:
            raise ActionError(f"no nsqd or nsqlookupd holds topic {topic}")
        results = await self._post_all(targets)
        failed = [f"{where}: {why}" for where, why in results if why != "OK"]
        what = f"{verb} {kind} {topic}" + (f"/{channel}" if channel else "")
        done = [where for where, why in results if why == "OK"]
        message = f"{what}: OK on {', '.join(done) or 'nothing'}"
        if failed:
            message += "; FAILED on " + ", ".join(failed)
        return not failed, message

    async def _post_all(self, urls: Sequence[str]) -> list[tuple[str, str]]:
        results: list[tuple[str, str]] = [("", "")] * len(urls)
        client = self.client

        async def post(i: int, url: str) -> None:
            where = url.split("/")[2]
            try:
                response = await client.post(url)
            except httpx.HTTPError as exc:
                results[i] = (where, type(exc).__name__)
                return
            if response.is_success:
                results[i] = (where, "OK")
            else:
                try:
                    why = str(response.json().get("message"))
                except ValueError:
                    why = response.text.strip()
                results[i] = (where, f"HTTP {response.status_code} {why}")

        async with trio.open_nursery() as nursery:
            for i, url in enumerate(urls):
                nursery.start_soon(post, i, url)
        return results
