"""A message as a consumer hands it out, with the responses it allows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

__all__ = ["Message", "deliveries"]

_current_task = trio.lowlevel.current_task


def cancel_may_be_pending() -> bool:
    """Whether the current task may have a cancellation to deliver: then
    ``trio.lowlevel.checkpoint_if_cancelled()`` must run; else it would do
    nothing.  The test is that function's own, read directly (on every
    message's path: a coroutine and a lookup chain less, 0.07 instead of
    0.2 us); a Trio without the attribute answers True (the public call)."""
    try:
        return _current_task()._cancel_status.effectively_cancelled
    except AttributeError:
        return True


class _Responder(Protocol):
    """What a message needs from its consumer to answer nsqd.

    Finishing and requeueing only queue a command and update counters: they do
    not wait, so an answer is never cancelled halfway.
    """

    #: the messages handed out (to a handler or through iteration) and not
    #: answered yet, as an ordered set; the consumer adds, answering removes
    out: dict[Message, None]
    #: the nsqd (``host:port``) whose messages it answers
    address: str
    #: the number of the connection's read under way (see :func:`deliveries`)
    read_stamp: int

    def fin(self, message: Message) -> None:
        """Queue FIN for ``message`` (answered: :meth:`Message.finish`)."""

    def req(self, message: Message, delay: float | None, backoff: bool) -> None:
        """Queue REQ for ``message`` (answered: :meth:`Message.requeue`)."""

    async def touch(self, message: Message) -> None:
        """Send TOUCH for ``message`` (:meth:`Message.touch`)."""


class Message:
    """One delivery of a message.

    Exactly one of :meth:`finish` and :meth:`requeue` takes effect; once one has,
    later calls of either do nothing (like go-nsq).  Messages are never touched
    automatically: call :meth:`touch` to ask nsqd for more time.
    """

    __slots__ = (
        "address",
        "attempts",
        "body",
        "id",
        "read_stamp",
        "responded",
        "responder",
        "timestamp",
    )

    def __init__(
        self,
        id: bytes,
        body: bytes,
        attempts: int,
        timestamp: int,
        address: str,
        responder: _Responder,
    ) -> None:
        #: the 16-byte message id
        self.id = id
        self.body = body
        #: deliveries so far, this one included (1 the first time)
        self.attempts = attempts
        #: when nsqd received the message, in nanoseconds since the epoch
        self.timestamp = timestamp
        #: the nsqd (``host:port``) that delivered it
        self.address = address
        #: ``"finished"``, ``"requeued"`` or ``None`` while unanswered
        self.responded: str | None = None
        #: internal: the consumer's side of the connection that answers it
        #: (go-nsq's ``Message.Delegate``)
        self.responder = responder
        #: internal: the number of the connection's read it came in (see
        #: :class:`trionsq.session.Session`)
        self.read_stamp = 0

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id.decode(errors='replace')} attempts={self.attempts} "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''}>"
        )

    @property
    def has_responded(self) -> bool:
        return self.responded is not None

    async def finish(self) -> None:
        """FIN: nsqd forgets the message."""
        # A cancellation point (before anything happens), not a scheduling one:
        # finishing a batch of messages must not cost a scheduler pass each.
        if cancel_may_be_pending():
            await trio.lowlevel.checkpoint_if_cancelled()
        if self.responded is None:
            self.responded = "finished"
            self.responder.fin(self)

    async def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: nsqd redelivers the message after ``delay`` seconds.

        ``delay=None`` derives it from the attempts (``default_requeue_delay *
        attempts``, capped at ``max_requeue_delay``).  ``backoff=True`` counts this
        as a handler failure for the consumer's backoff.
        """
        if delay is not None and (not isinstance(delay, int | float) or delay < 0):
            raise ValueError(f"requeue delay must be a number >= 0, got {delay!r}")
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.responded is None:
            self.responded = "requeued"
            self.responder.req(self, delay, backoff)

    async def touch(self) -> None:
        """TOUCH: reset nsqd's timeout for this message (while unanswered)."""
        if self.responded is None:
            await self.responder.touch(self)

    # For the front ends (trionsq.hosting.consumer, trionsq.aio), whose loops
    # settle a batch of messages and check for cancellation once a batch.

    def finish_now(self) -> None:
        """:meth:`finish` without its cancellation point, in Trio's thread."""
        if self.responded is None:
            self.responded = "finished"
            self.responder.fin(self)

    def requeue_now(self, delay: float | None, backoff: bool) -> None:
        """:meth:`requeue` without its checks (done by the caller) and its
        cancellation point, in Trio's thread."""
        if self.responded is None:
            self.responded = "requeued"
            self.responder.req(self, delay, backoff)


def deliveries(responder: _Responder) -> Callable[[int, int, bytes, bytes], Message]:
    """The constructor of the messages a connection reads, for its parser
    (``factory(timestamp, attempts, id, body)``): each answered by
    ``responder``, stamped with its current ``read_stamp``.

    The internal fast path past :meth:`Message.__init__` (one call less and
    no keyword handling, on every message a consumer receives): the one
    place a Message is made without it, with the same attributes set.
    """
    new = object.__new__
    address = responder.address

    def make(timestamp: int, attempts: int, id: bytes, body: bytes) -> Message:
        message = new(Message)
        message.id = id
        message.body = body
        message.attempts = attempts
        message.timestamp = timestamp
        message.address = address
        message.responded = None
        message.responder = responder
        message.read_stamp = responder.read_stamp
        return message

    return make
