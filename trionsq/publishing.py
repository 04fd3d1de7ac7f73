"""The publish pipeline's core, without I/O: what every producer does alike.

trionsq has three producers: :class:`trionsq.Producer` (Trio),
:class:`trionsq.blocking.Producer` (the calling thread does its own I/O) and
:class:`trionsq.aio.Producer` (asyncio's own transports).  They differ only in
how bytes move; everything else is here, once:

- :class:`PublishCore`: the checks and the encoding of ``PUB``, ``MPUB`` and
  ``DPUB`` (what a bad argument raises, before anything is sent), the
  interpretation of an answer (``OK``, else :class:`ProtocolError`) and the
  counters of :class:`ProducerStats`;
- :class:`Answers`: the publishes awaiting their answers on one connection, in
  order, and the bytes nsqd sends back turned into those answers (nsqd answers
  in order; a heartbeat is to be answered with ``NOP``; an error frame ends the
  connection, and what was sent after the failed command was never executed);
- :class:`Rotation`: which nsqd to connect to: the addresses in order, starting
  with the last one that worked, moving on after a failure, and the error to
  raise when none could be reached.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .connection import ConnectionClosedError, NegotiationError, NSQConnectionError
from .protocol import commands
from .protocol.errors import BadBodyError, BadMessageError, NSQErrorResponse, ProtocolError
from .protocol.frames import (
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    OK,
    Error,
    FrameParser,
    Response,
    encode_frame,
)
from .protocol.names import check_topic
from .reasons import cannot_connect, naming

__all__ = [
    "Answers",
    "Completion",
    "Counters",
    "NotPublishedError",
    "ProducerStats",
    "PublishCore",
    "Rotation",
    "check_body",
]

log = logging.getLogger("trionsq.producer")

_BYTES = {bytes}

#: how many valid topic names a producer remembers (a bound, not a tuning knob)
_VALID_TOPICS_KEPT = 1000

#: an ``OK`` response frame, as nsqd sends it (one round trip's whole read)
OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, OK)
_OK_FRAME_SIZE = len(OK_FRAME)


class NotPublishedError(ConnectionClosedError):
    """The connection ended before nsqd read this publish: it was not published.

    nsqd executes a connection's commands in order and closes it after an
    error frame, without executing what followed; a publish queued behind
    one that failed so, or never written, is certainly not published (unlike
    a plain :class:`ConnectionClosedError`, after which it may have been).
    """


def check_body(verb: str, body: bytes) -> bytes:
    """``body`` as the bytes a ``verb`` sends; raises what the publish raises
    for a body that is not bytes-like or is empty (nsqd's own error)."""
    if type(body) is bytes and body:
        return body  # the common case: nothing to check further, nothing to copy
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"message body must be bytes, not {type(body).__name__}")
    data = bytes(body)
    if not data:
        raise BadMessageError(f"{verb} invalid message body size 0")
    return data


def _check_delay(delay: float) -> int:
    """``delay`` seconds as DPUB's milliseconds; raises for a bad delay."""
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise TypeError("delay must be a number of seconds")
    if not math.isfinite(delay) or delay < 0:
        raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
    return round(delay * 1000)


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A snapshot of a producer's counters (see :attr:`trionsq.Producer.stats`).

    ``published`` counts messages nsqd acknowledged (an MPUB of n counts n),
    ``batches`` the acknowledged MPUBs among them, ``errors`` the publishes
    that raised after their arguments were accepted (no nsqd reachable, a
    refusal, a lost connection).  ``in_flight`` is how many publishes hold a
    place in the window right now, out of ``window`` (``publish_window``).
    """

    published: int = 0
    batches: int = 0
    errors: int = 0
    in_flight: int = 0
    window: int = 0


class Counters:
    """What a producer counts (see :class:`ProducerStats`)."""

    def __init__(self) -> None:
        self.published = 0
        self.batches = 0
        self.errors = 0

    def add(self, other: Counters) -> None:
        """Add ``other``'s counts to these (a connection's, at its end)."""
        self.published += other.published
        self.batches += other.batches
        self.errors += other.errors

    def stats(self, in_flight: int, window: int) -> ProducerStats:
        return ProducerStats(self.published, self.batches, self.errors, in_flight, window)


class PublishCore(Counters):
    """A producer's checks, encoding, answers and counters (no I/O).

    The encoders return a command's bytes (``mpub`` also its message count,
    the ``batch`` the answer is counted with; PUB and DPUB count as batch 0)
    or raise what the publish raises for its arguments: ``TypeError``,
    ``ValueError``, nsqd's own ``BadTopicError``/``BadMessageError``/
    ``BadBodyError``.  Valid topic names are remembered, so a topic published
    to again costs a set look-up.
    """

    def __init__(self) -> None:
        super().__init__()
        #: topic names found valid (a few, in practice: each checked once)
        self.valid_topics: set[str] = set()

    def check_topic(self, verb: str, topic: str) -> None:
        """Raise what publishing to ``topic`` raises before sending anything
        (:func:`trionsq.protocol.names.check_topic`)."""
        if type(topic) is str and topic in self.valid_topics:
            return
        check_topic(verb, topic)
        if len(self.valid_topics) >= _VALID_TOPICS_KEPT:
            self.valid_topics.clear()
        self.valid_topics.add(topic)

    def pub(self, topic: str, body: bytes) -> bytes:
        if type(topic) is not str or topic not in self.valid_topics:
            self.check_topic("PUB", topic)
        if type(body) is not bytes or not body:
            body = check_body("PUB", body)
        return commands.pub(topic, body)

    def mpub(self, topic: str, bodies: Iterable[bytes]) -> tuple[bytes, int]:
        if type(topic) is not str or topic not in self.valid_topics:
            self.check_topic("MPUB", topic)
        data = bodies if type(bodies) is list else list(bodies)
        if not data:
            raise BadBodyError("MPUB invalid message count 0")
        if set(map(type, data)) != _BYTES or not all(data):  # all bytes, none empty
            data = [check_body("MPUB", body) for body in data]  # the rare case
        return commands.mpub(topic, data), len(data)

    def dpub(self, topic: str, body: bytes, delay: float) -> bytes:
        self.check_topic("DPUB", topic)
        delay_ms = _check_delay(delay)
        return commands.dpub(topic, delay_ms, check_body("DPUB", body))

    def answered(self, response: bytes, batch: int) -> None:
        """Count an answer to a publish (``batch``: its MPUB's message count,
        0 for PUB and DPUB); anything but ``OK`` raises :class:`ProtocolError`."""
        if response != OK:
            self.errors += 1
            raise unexpected(response)
        self.published += batch or 1
        if batch:
            self.batches += 1


def unexpected(response: bytes) -> ProtocolError:
    """The error for an answer to a publish that is neither ``OK`` nor an error frame."""
    return ProtocolError(f"unexpected response to a publish: {response[:100]!r}")


class Completion(Protocol):
    """Where a publish's outcome goes: a thread's waiter, a future."""

    def set_result(self, value: None) -> object: ...

    def set_exception(self, error: BaseException) -> object: ...


W = TypeVar("W", bound=Completion)
T = TypeVar("T")


class Answers(Generic[W]):
    """The publishes awaiting their answers on one connection, in order.

    ``expect(waiter, batch)`` when a publish's bytes are queued for the
    connection, in the same order (or append ``(waiter, batch)`` to
    :attr:`waiting`); :meth:`received` with the bytes that come back hands
    each answer to its waiter (``set_result(None)``, or ``set_exception``
    with nsqd's error), counted in ``counters``.  An error frame fails its
    publish with nsqd's typed error and ends the connection, as nsqd does
    (:meth:`received` raises it then; the driver closes the connection).
    """

    def __init__(self, counters: Counters, max_frame_size: int) -> None:
        self.counters = counters
        #: (waiter, batch) of each publish sent, oldest first
        self.waiting: deque[tuple[W, int]] = deque()
        self._parser = FrameParser(max_frame_size)
        #: the parser holds part of a frame (a lean reader that compares whole
        #: reads with ``OK`` must not: see :class:`trionsq.blocking.direct.DirectConnection`)
        self.partial = False

    def __len__(self) -> int:
        return len(self.waiting)

    def expect(self, waiter: W, batch: int) -> None:
        self.waiting.append((waiter, batch))

    def received(self, data: bytes) -> int:
        """Answer the publishes ``data`` completes; returns how many
        heartbeats came (each to be answered with ``NOP``).

        Raises :class:`ProtocolError` for bytes that are no answer to a
        publish, and nsqd's error (after failing its publish with it) for an
        error frame: either way the connection is over.
        """
        waiting = self.waiting
        if not self.partial and data.startswith(OK_FRAME):
            if data == OK_FRAME and waiting:
                # One round trip's read: one OK, for the oldest publish.
                waiter, batch = waiting.popleft()
                counters = self.counters
                counters.published += batch or 1
                if batch:
                    counters.batches += 1
                waiter.set_result(None)
                return 0
            count, rest = divmod(len(data), _OK_FRAME_SIZE)
            # count non-overlapping matches in count * 10 bytes tile them exactly
            if not rest and count <= len(waiting) and data.count(OK_FRAME) == count:
                # A run of OKs (pipelined publishes), for as many publishes.
                counters = self.counters
                popleft = waiting.popleft
                for _ in range(count):
                    waiter, batch = popleft()
                    counters.published += batch or 1
                    if batch:
                        counters.batches += 1
                    waiter.set_result(None)
                return 0
        heartbeats = 0
        frames = self._parser.feed(data)
        self.partial = self._parser.buffered > 0
        for frame in frames:
            if type(frame) is Error:
                error = frame.error
                if not error.fatal:  # (nsqd sends none to a publisher)
                    log.warning("nsqd: %s", error)
                    continue
                if waiting:
                    waiter, _ = waiting.popleft()
                    self.counters.errors += 1
                    waiter.set_exception(error)
                # nsqd closes the connection now, without executing what follows.
                refused = f"not published: nsqd refused a publish before it ({error})"
                self.end(NotPublishedError(refused))
                raise error
            if type(frame) is not Response:
                raise ProtocolError("nsqd sent a message to a producer")
            data = frame.data
            if data == HEARTBEAT:
                heartbeats += 1
            elif not waiting:
                raise ProtocolError(f"unexpected response {data[:100]!r}")
            else:
                waiter, batch = waiting.popleft()
                if data != OK:
                    self.counters.errors += 1
                    wrong = unexpected(data)
                    waiter.set_exception(wrong)
                    raise wrong
                self.counters.published += batch or 1
                if batch:
                    self.counters.batches += 1
                waiter.set_result(None)
        return heartbeats

    def end(self, error: ConnectionClosedError) -> None:
        """The connection is over: fail every publish still waiting with ``error``."""
        waiting = self.waiting
        while waiting:
            waiter, _ = waiting.popleft()
            self.counters.errors += 1
            waiter.set_exception(error)


class Rotation:
    """Which nsqd a producer connects to, and what it says when none answers.

    ::

        attempt = rotation.attempt()
        for address in attempt:
            try:
                conn = connect(address)
            except Exception as exc:
                attempt.failed(address, exc)   # raises what is no failure to connect
            else:
                attempt.connected(address)
                return conn
        raise attempt.error()

    The addresses are tried in order, starting with the last one that worked;
    a connection that ended badly (:meth:`lost`, not for nsqd's own refusal of
    a command) moves the start on to the next one.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("a Producer needs at least one address in nsqd_tcp_addresses")
        self.addresses = tuple(addresses)
        self.index = 0

    def attempt(self) -> Attempt:
        return Attempt(self)

    def first(self, open: Callable[[str], T]) -> T:
        """What ``open(address)`` returns for the first address that opens
        (the loop above, for a driver that blocks: the blocking and asyncio
        front ends' connects); raises :meth:`Attempt.error` if none does."""
        attempt = Attempt(self)
        for address in attempt:
            try:
                opened = open(address)
            except Exception as exc:
                attempt.failed(address, exc)
                continue
            attempt.connected(address)
            return opened
        raise attempt.error()

    def lost(self, address: str, reason: BaseException | None) -> None:
        """A connection to ``address`` ended, for ``reason`` (None: closed
        cleanly): if nsqd itself looks unwell, the next attempt starts with
        the next address."""
        if reason is None or isinstance(reason, NSQErrorResponse):
            return
        addresses = self.addresses
        if addresses[self.index % len(addresses)] == address:
            self.index = (self.index + 1) % len(addresses)


class Attempt:
    """One round of connection attempts (see :class:`Rotation`)."""

    def __init__(self, rotation: Rotation) -> None:
        self._rotation = rotation
        self._start = rotation.index  # read once: a lost connection may move it meanwhile
        self._failures: list[str] = []
        self._refusals: list[NSQErrorResponse] = []

    def __iter__(self) -> Iterator[str]:
        addresses = self._rotation.addresses
        for step in range(len(addresses)):
            yield addresses[(self._start + step) % len(addresses)]

    def connected(self, address: str) -> None:
        self._rotation.index = self._rotation.addresses.index(address)

    def failed(self, address: str, exc: BaseException) -> None:
        """Note why ``address`` failed; raises ``exc`` itself if it is no
        failure to connect (a bug, a cancellation...)."""
        if isinstance(exc, NSQErrorResponse):
            log.warning("%s refused the connection: %s", address, exc)
            self._refusals.append(exc)
        elif not isinstance(exc, NSQConnectionError | NegotiationError | ProtocolError):
            raise exc
        else:
            log.warning("%s", cannot_connect(address, exc))
        self._failures.append(naming(address, exc))

    def error(self) -> NSQConnectionError | NSQErrorResponse:
        """What to raise when no address could be connected to: nsqd's typed
        refusal when every nsqd refused (``E_AUTH_FAILED``...), else
        :class:`NSQConnectionError` naming each address and its failure."""
        if self._refusals and len(self._refusals) == len(self._rotation.addresses):
            return self._refusals[0]
        return NSQConnectionError("no nsqd reachable (" + "; ".join(self._failures) + ")")
