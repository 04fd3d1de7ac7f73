"""A topic: where publishers put messages, copied to each of its channels.

Messages published while the topic has no channel (or is paused) wait in the
topic's own queue, as in nsqd, and go to the channels that exist once the topic
has some (and is unpaused).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from trionsq.protocol.names import is_ephemeral

from .channel import Channel
from .message import Message, MessageQueue
from .stats import LatencyStream

if TYPE_CHECKING:
    from .owner import TopicOwner

__all__ = ["Topic"]


class Topic:
    """A topic; created by PUB, SUB or ``/topic/create``."""

    def __init__(self, name: str, nsqd: TopicOwner) -> None:
        self.name = name
        self.nsqd = nsqd
        self.ephemeral = is_ephemeral(name)
        self.channels: dict[str, Channel] = {}
        self.queue: MessageQueue = nsqd.new_queue(name, None)
        self.paused = False
        self.exiting = False
        # Not started while nsqd asks nsqlookupd which channels to pre-create:
        # messages wait in the topic until then, as before nsqd's topic.Start().
        self.started = True
        self._started_event: trio.Event | None = None
        self.message_count = 0
        self.message_bytes = 0
        self.e2e = LatencyStream(nsqd.options)

    def __repr__(self) -> str:
        return f"Topic({self.name})"

    def depth(self) -> int:
        return len(self.queue)

    def new_message(self, body: bytes, defer: float = 0.0, timestamp: int | None = None) -> Message:
        """A message with a fresh id (``defer``: a DPUB delay in seconds)."""
        msg = Message(self.nsqd.guids.new_id(), body, timestamp)
        msg.deferred = defer
        return msg

    def new_messages(self, bodies: list[bytes]) -> list[Message]:
        """Messages for an MPUB (one timestamp for the batch)."""
        ids = self.nsqd.guids.new_ids(len(bodies))
        now = time.time_ns()
        return [Message(i, body, now) for i, body in zip(ids, bodies, strict=True)]

    def put(self, msg: Message) -> None:
        self.put_many([msg])

    def admit(self, count: int) -> None:
        """Raise the error a fault injects for a publish of ``count`` messages."""
        hooks = self.nsqd.hooks
        if hooks is not None:
            hooks.before_put(self.name, count)

    def put_many(self, msgs: Sequence[Message], *, admitted: bool = False) -> None:
        """Publish: count, then fan out (or keep, with no channel or paused).
        ``admitted``: :meth:`admit` was called for them already."""
        if not admitted:
            self.admit(len(msgs))  # a fault may refuse the publish
        self.message_count += len(msgs)
        if len(msgs) == 1:  # a PUB
            self.message_bytes += len(msgs[0].body)
        else:
            self.message_bytes += sum([len(m.body) for m in msgs])
        if self.paused or not self.channels or not self.started:
            if self.ephemeral:
                # no disk behind an ephemeral topic's memory queue either
                room = max(0, self.nsqd.options.mem_queue_size - len(self.queue))
                msgs = msgs[:room]
            self.queue.put_many(msgs)
            return
        self._fan_out(msgs)

    def takes_batches(self) -> bool:
        """Whether one :meth:`put_many` of several publishes' messages ends
        exactly as one call per publish would: with at most one client on each
        channel, handing messages out after each publish or after all of them
        sends each client the same messages, in flight in the same order."""
        for channel in self.channels.values():
            if len(channel.clients) > 1:
                return False
        return True

    def _fan_out(self, msgs: Sequence[Message]) -> None:
        channels = list(self.channels.values())
        first = True
        for channel in channels:
            # The first channel gets the original, the others their own copies
            # (same id and timestamp), as nsqd's messagePump does.
            copies = msgs if first else [m.copy() for m in msgs]
            first = False
            plain: list[Message] = []
            for m in copies:
                if m.deferred > 0:
                    channel.put_deferred(m, m.deferred)
                else:
                    plain.append(m)
            if plain:
                channel.put_many(plain)

    def _drain(self) -> None:
        """Move waiting messages to the channels (a channel appeared, or unpause)."""
        if self.paused or not self.channels or not self.started or not self.queue:
            return
        waiting: list[Message] = []
        while (msg := self.queue.get()) is not None:
            waiting.append(msg)
        self._fan_out(waiting)

    # --- channels ---

    def get_channel(self, name: str) -> Channel:
        """The channel, created (and registered) if new."""
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self, name, self.nsqd)
            self.channels[name] = channel
            self.nsqd.start_channel(channel)
            self.nsqd.notify_registry("register", self.name, name)
            self._drain()
        return channel

    def delete_channel(self, name: str) -> bool:
        channel = self.channels.pop(name, None)
        if channel is None:
            return False
        channel.close()
        # Deleted, not stopped: its disk queue goes with it, as nsqd's backend.
        channel.queue.delete()
        self.nsqd.notify_registry("unregister", self.name, name)
        if self.ephemeral and not self.channels and not self.exiting:
            self.nsqd.delete_topic(self.name)
        return True

    def start(self) -> None:
        """Start fanning out (after channels were pre-created from nsqlookupd)."""
        self.started = True
        if self._started_event is not None:
            self._started_event.set()
        self._drain()

    async def wait_started(self) -> None:
        """Until :meth:`start` (at once if started, or deleted meanwhile)."""
        if self.started or self.exiting:
            return
        if self._started_event is None:
            self._started_event = trio.Event()
        await self._started_event.wait()

    # --- admin ---

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self._drain()

    def empty(self) -> None:
        self.queue.clear()

    def close(self) -> None:
        """The topic is deleted: every channel goes (and its clients are closed)."""
        self.exiting = True
        if self._started_event is not None:  # no creator waits for a deleted topic
            self._started_event.set()
        for name in list(self.channels):
            self.delete_channel(name)
        self.queue.delete()
