"""A request/reply link between two of the source's processes, over frames.

The coordinator and each agent keep one TCP connection per query; either side
sends requests (a header with an ``id``) and notifications (no ``id``), and
replies carry the request's id back in ``re``.  Frames in are held to the
receiver's :class:`~._framing.Limits`; a frame out that the peer does not take
within ``send_timeout`` (it stopped reading) breaks the link: a half-written frame
leaves nothing to go on with.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import trio

from ._framing import FrameReceiver, Limits
from ._framing import send as send_frame

__all__ = ["Link", "ReadError"]


class ReadError(Exception):
    """A read this agent cannot serve; the task fails with this one-line reason."""


class Link:
    """Frames to and from one peer over a stream: requests with ids, and replies."""

    def __init__(self, stream: trio.abc.Stream, limits: Limits, send_timeout: float = 15.0) -> None:
        self.stream = stream
        self.receive = FrameReceiver(stream, limits)
        self.send_timeout = send_timeout
        self._send_lock = trio.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[trio.Event, list[dict[str, Any]]]] = {}
        self.closed = False
        self.last_heard = trio.current_time()

    async def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        async with self._send_lock:
            if self.closed:
                raise trio.ClosedResourceError("link closed")
            try:
                with trio.fail_after(self.send_timeout):
                    await send_frame(self.stream, header, payload)
            except trio.TooSlowError:
                self.fail_pending()
                await trio.aclose_forcefully(self.stream)
                raise trio.BrokenResourceError("the peer stopped reading") from None

    async def request(self, header: dict[str, Any], patience: float = math.inf) -> dict[str, Any]:
        """Send ``header`` with a new id and wait for the reply carrying it back."""
        if self.closed:
            raise ConnectionError("link closed")
        ident = next(self._ids)
        event = trio.Event()
        box: list[dict[str, Any]] = []
        self._pending[ident] = (event, box)
        try:
            await self.send({**header, "id": ident})
            with trio.fail_after(patience):
                await event.wait()
        finally:
            self._pending.pop(ident, None)
        if not box:
            raise ConnectionError("link closed before the reply")
        reply = box[0]
        if "error" in reply:
            raise ReadError(str(reply["error"]))
        return reply

    def deliver(self, header: dict[str, Any]) -> bool:
        """Hand a reply to its waiting request; False if ``header`` is not a reply."""
        ident = header.get("re")
        if not isinstance(ident, int):
            return False
        waiting = self._pending.get(ident)
        if waiting is not None:
            waiting[1].append(header)
            waiting[0].set()
        return True

    def fail_pending(self) -> None:
        self.closed = True
        for event, _ in self._pending.values():
            event.set()
