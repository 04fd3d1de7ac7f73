"""A consumer's side of one connection, and the path of its messages.

:class:`Session` is one live, subscribed connection of a
:class:`~trionsq.consumer.Consumer`: the RDY it queued, the messages it handed
out (it answers them: it is their ``responder``), and how many more nsqd's
protocol lets it send (reading within RDY: what comes beyond is held, and
reading that connection waits).  :class:`Sessions` is the consumer's side of
that path, which the Consumer inherits: a read's messages taken (within RDY),
queued or given up, an answer settled (backoff and RDY updated, the FIN or REQ
queued).  The RDY decisions themselves are :mod:`trionsq.flow`'s.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import trio

from .backoff import Backoff, BackoffState
from .config import Config
from .connection import Connection, PendingResponse
from .lifecycle import OPEN, Life, Lifecycle
from .message import Message, deliveries
from .protocol import commands
from .protocol.errors import NSQError
from .protocol.frames import OversizedMessage
from .rdy import ConnRdy, RdyController

if TYPE_CHECKING:
    from .consumer import Consumer
    from .telemetry import ConsumerTelemetry

__all__ = ["Session", "Sessions"]

log = logging.getLogger("trionsq.consumer")

_NORMAL = BackoffState.NORMAL


class Session:
    """One live, subscribed connection; a message's responder."""

    def __init__(self, consumer: Consumer, conn: Connection) -> None:
        self.consumer = consumer
        self.conn = conn
        self.address = conn.address
        self.wire_generation = 0
        self.wire_rdy = 0  # the last RDY queued
        #: whether a RDY above 0 was ever queued (nsqd may have sent under it)
        self.had_rdy = False
        #: the RDY controller's state for this connection, while it has one
        self.rdy_state: ConnRdy | None = None
        #: messages handed out and not answered yet (see message._Responder)
        self.out: dict[Message, None] = {}
        #: shields the connection from cancellation while leaving needs it
        #: (see Consumer._serve); the consumer cancels it when done with it
        self.scope = trio.CancelScope(shield=True)
        #: nsqd's answer to this session's CLS, once queued
        self.cls: PendingResponse | None = None
        #: whether a message arrived after CLOSE_WAIT (there is at most one)
        self.straggled = False
        #: the RDY last queued on this connection, and how many more nsqd
        #: may send under the one before, if it was higher (it sends under
        #: that one until it reads the new one: the room that was left then;
        #: the answers queued after the RDY are read after it, so they make
        #: no more room under the old one)
        self.rdy_limit = 0
        self.grace = 0
        #: messages received beyond ``rdy_limit`` (nsqd resends what timed
        #: out; a broken or hostile one ignores RDY), kept until earlier ones
        #: are answered, reading this connection waiting meanwhile (see
        #: Consumer._on_messages): what a consumer holds stays bounded by RDY
        #: and one read, whatever the server sends
        self.held: deque[Message] = deque()
        # Set when room may have come for what is held (see _release).
        self._room: trio.Event | None = None
        self._warned = False
        #: nsqd's message timeout for this connection (what it said in
        #: IDENTIFY's answer, else what was asked, else its default)
        self.msg_timeout = conn.msg_timeout or consumer.config.msg_timeout or 60.0
        #: reads of messages so far: each message keeps the number of the
        #: read it came in (``Message.read_stamp``), which says when it arrived
        self.read_stamp = 0
        #: the connection's parser makes each message with this (see
        #: :func:`trionsq.message.deliveries`)
        self.make_message = deliveries(self)
        #: ``(first read, its time)`` a bucket each ``bucket_width`` seconds,
        #: for the last ``msg_timeout`` (see room)
        self.arrivals: deque[tuple[int, float]] = deque()
        self.bucket_width = self.msg_timeout / 32
        # Unanswered messages that arrived more than msg_timeout ago (nsqd may
        # have timed them out), as of the last count, and until when that
        # count holds at least (answers only make it smaller).
        self._stale = 0
        self._stale_until = -math.inf
        self._first_recent = 0

    # RDY, FIN and REQ are queued without waiting (Connection.send_nowait): one
    # per RDY decision or per message nsqd handed out bounds them, and settling
    # a message then has no await in it, so it cannot be cancelled halfway.

    def flush_rdy(self) -> None:
        """Queue the RDY the controller decided last (if not sent yet)."""
        state = self.consumer._rdy.conns.get(self)
        if state is None or state.generation == self.wire_generation:
            return
        self.wire_generation = state.generation
        self.wire_rdy = state.rdy
        if state.rdy:
            self.had_rdy = True
        if state.rdy < self.rdy_limit:
            # nsqd goes on under the old RDY until it reads this one: what it
            # may still send under it is allowed on top of the new one.
            self.grace = max(0, self.room(trio.current_time()))
        elif state.rdy > self.rdy_limit:
            self.wake()
        self.rdy_limit = state.rdy
        try:
            self.conn.send_nowait(commands.rdy(state.rdy))
        except NSQError:
            pass  # the reader notices the end of the connection

    def _send(self, data: bytes) -> bool:
        try:
            self.conn.send_nowait(data)
        except NSQError as exc:
            # nsqd will time the message out and redeliver it.
            log.info("%s: could not answer a message: %s", self.address, exc)
            return False
        return True

    def fin(self, message: Message) -> None:
        consumer = self.consumer
        state = self.rdy_state
        if (
            state is None
            or consumer._life.state is not OPEN
            or consumer._backoff.state is not _NORMAL
            or consumer._rdy.due
        ):
            consumer._settle(self, message, commands.fin(message.id), True, True)
            return
        # The steady state, on every message: a success changes no backoff and
        # frees budget no connection is waiting for, so no RDY is decided
        # (what _settle would find out, the long way).
        self.out.pop(message, None)
        if state.in_flight > 0:
            state.in_flight -= 1
        if self.held:
            self.wake()
        try:
            self.conn.send_nowait(b"FIN " + message.id + b"\n")
        except NSQError as exc:
            log.info("%s: could not answer a message: %s", self.address, exc)
        else:
            consumer._finished += 1

    def req(self, message: Message, delay: float | None, backoff: bool) -> None:
        if delay is None:
            delay = self.consumer.config.requeue_delay(message.attempts)
        if self.consumer._telemetry is not None:
            self.consumer._telemetry.requeued(message, delay)
        data = commands.req(message.id, round(delay * 1000))
        self.consumer._settle(self, message, data, False, False if backoff else None)

    async def touch(self, message: Message) -> None:
        if self.consumer._telemetry is not None:
            self.consumer._telemetry.touched(message)
        try:
            await self.conn.send(commands.touch(message.id))
        except NSQError as exc:
            log.info("%s: could not touch a message: %s", self.address, exc)

    # --- reading within RDY ---

    def note_read(self, now: float) -> None:
        """A read of messages (made with the current ``read_stamp``) at ``now``."""
        arrivals = self.arrivals
        if not arrivals or now - arrivals[-1][1] >= self.bucket_width:
            cutoff = now - self.msg_timeout - self.bucket_width
            while arrivals and arrivals[0][1] <= cutoff:
                arrivals.popleft()
            arrivals.append((self.read_stamp, now))
            # These stop counting then: the stale count is due again by then.
            self._stale_until = min(self._stale_until, now + self.msg_timeout)
        self.read_stamp += 1

    def room(self, now: float) -> int:
        """How many more messages nsqd's protocol lets it send now: the RDY
        last queued (and what it may still send under a higher one before it
        read this one) less the messages it may still have in flight.  A
        message unanswered for longer than ``msg_timeout`` may have timed out
        at nsqd, which then sends another in its place (or the same again):
        those do not count."""
        state = self.rdy_state
        if state is None:
            return 0
        return self.rdy_limit + self.grace - max(0, state.in_flight - self._count_stale(now))

    def _superseded(self, arriving: list[Message]) -> int:
        """Unanswered messages that nsqd is sending again (a message is in
        flight once at a time: one that comes again was timed out there,
        whatever the time says, e.g. by a channel emptied).  Queued, not handed
        out yet, the old copy is dropped (the new one takes its place); handed
        out, it stops counting as in flight.  Rare: only beyond RDY."""
        ids = {m.id for m in arriving}
        first_recent = self._first_recent
        superseded = 0
        for m in self.out:
            if m.id in ids and m.read_stamp >= first_recent:
                superseded += 1
        queue = self.consumer._queue
        old = [m for m in queue if m.responder is self and m.id in ids]
        for m in old:
            queue.remove(m)
            m.responded = "requeued"  # by nsqd: nothing to answer
            self.consumer._rdy.on_settled(self)
        return superseded

    def _count_stale(self, now: float) -> int:
        """How many unanswered messages arrived before the last
        ``msg_timeout`` (a bucket's width less at most: counted as arrived
        when their bucket began, so never one too many in flight)."""
        if now < self._stale_until:
            return self._stale  # answers since can only have made it smaller
        cutoff = now - self.msg_timeout
        first_recent = None
        for stamp, start in self.arrivals:
            if start > cutoff:
                first_recent = stamp
                self._stale_until = start + self.msg_timeout
                break
        if first_recent is None:
            first_recent = self.read_stamp
            self._stale_until = math.inf  # until the next read
        self._first_recent = first_recent
        # Rare (only beyond RDY): the unanswered messages, handed out or queued.
        self._stale = sum(1 for m in self.out if m.read_stamp < first_recent) + sum(
            1 for m in self.consumer._queue if m.responder is self and m.read_stamp < first_recent
        )
        return self._stale

    def admit(self, arriving: list[Message], now: float) -> int:
        """How many of the ``arriving`` messages (in order) nsqd's protocol
        allows (see :meth:`room`); those beyond the RDY last queued use up the
        room left under the one before."""
        state = self.rdy_state
        if state is None:
            return 0
        stale = self._count_stale(now)
        superseded = self._superseded(arriving)  # (drops queued copies first)
        in_flight = max(0, state.in_flight - stale - superseded)
        limit = self.rdy_limit
        admitted = max(0, min(len(arriving), limit + self.grace - in_flight))
        # The ones beyond RDY among those just admitted use the grace up.
        beyond = max(0, in_flight + admitted - limit) - max(0, in_flight - limit)
        self.grace -= min(beyond, self.grace)
        return admitted

    def wake(self) -> None:
        """Room may have come for what is held (an answer, a higher RDY, leaving)."""
        if self._room is not None:
            self._room.set()

    def hold(self, messages: list[Message]) -> Awaitable[None]:
        """Keep ``messages`` (beyond RDY, or the writes backlogged): reading
        this connection waits on the returned awaitable, which hands them to
        the consumer as room comes."""
        self.held.extend(messages)
        state = self.rdy_state
        if not self._warned and state is not None and state.in_flight >= self.rdy_limit:
            self._warned = True
            log.warning(
                "%s: nsqd sent more messages than RDY %d allows (%d in flight, %d more "
                "held): reading it waits until earlier ones are answered (nsqd resends "
                "messages that timed out; or it ignores RDY)",
                self.address,
                self.rdy_limit,
                state.in_flight,
                len(self.held),
            )
        return self._release()

    async def _release(self) -> None:
        """Hand what is held to the consumer as RDY allows, and wait for the
        writes to drain: the connection reads nothing meanwhile.  While it
        waits, a NOP every heartbeat interval keeps nsqd from dropping a
        client it has not heard from (its handlers may take that long)."""
        consumer = self.consumer
        conn = self.conn
        keepalive = consumer.config.heartbeat_interval
        held = self.held
        next_nop = trio.current_time() + (keepalive or math.inf)
        while True:
            if conn.backlogged:
                await conn.wait_for_room()
                continue
            if self.rdy_state is None:  # the connection is leaving: nothing is answered
                held.clear()
                return
            now = trio.current_time()
            if consumer._life.state is not OPEN:
                room = len(held)  # requeued at once, nothing handed out
            else:
                room = self.admit(list(held), now)
            if room > 0:
                consumer._accept(self, [held.popleft() for _ in range(room)], now)
                continue
            if not held:
                return
            if now >= next_nop:
                next_nop = now + (keepalive or math.inf)
                try:
                    conn.send_nowait(commands.nop())
                except NSQError:
                    pass  # its reader finds out how it ended
            # Until an answer or a higher RDY, or an arrival stops counting.
            self._room = room_event = trio.Event()
            try:
                with trio.move_on_at(min(next_nop, self._stale_until)):
                    await room_event.wait()
            finally:
                self._room = None

    def start_close(self) -> None:
        """Queue CLS (once): nsqd sends nothing more and answers CLOSE_WAIT."""
        if self.cls is None:
            try:
                self.cls = self.conn.request_nowait(commands.cls())
            except NSQError:
                pass  # already closed: nothing more comes from it


class Sessions:
    """The message path's steps, for :class:`~trionsq.consumer.Consumer`
    (which inherits them, and sets these attributes up)."""

    config: Config
    _rdy: RdyController[Session]
    _backoff: Backoff
    _backoff_wakeup: trio.Event
    _queue: deque[Message]
    _queue_waiters: trio.lowlevel.ParkingLot
    _handlers: trio.Nursery | None
    _handler: Callable[[Message], object] | None
    _waking: int
    _giving_up: set[Message]
    _settled_event: trio.Event
    _straggled: trio.Event
    _life: Lifecycle[Life]
    _received: int
    _finished: int
    _requeued: int
    _given_up: int
    _telemetry: ConsumerTelemetry | None
    _update_rdy: Callable[[], None]
    _abandon: Callable[[Message], None]
    _wake_workers: Callable[[int], None]
    _give_up: Callable[[Message], Coroutine[Any, Any, None]]

    def _on_messages(self, session: Session, messages: list[Message]) -> Awaitable[None] | None:
        """Take one read's messages from ``session``'s reader (see
        MessagesCallback): within RDY, at once; beyond it (or with its writes
        backlogged), held while reading that connection waits."""
        now = trio.current_time()
        state = session.rdy_state
        if state is not None:
            # When they arrived (their read's number is in each): for counting
            # them against RDY only while nsqd may still have them in flight.
            session.note_read(now)
            if session.held or session.conn.backlogged:
                return session.hold(messages)
            if self._life.state is OPEN and len(messages) > session.rdy_limit - state.in_flight:
                # More than RDY, unless nsqd has not read a lowered one yet,
                # or some in flight have timed out there.
                room = session.admit(messages, now)
                if len(messages) > room:
                    if room > 0:
                        self._accept(session, messages[:room], now)
                    return session.hold(messages[room:])
        self._accept(session, messages, now)
        return None

    def _on_oversized(self, session: Session, frame: OversizedMessage) -> None:
        """A message above ``max_frame_size`` (its body was read past, never
        held): requeued like a failed one, given up (FIN) after
        ``max_attempts``; the error says so, and what to raise."""
        message = session.make_message(frame.timestamp, frame.attempts, frame.id, b"")
        self._received += 1
        if self._rdy.on_messages(session, 1, trio.current_time()):
            self._update_rdy()
        config = self.config
        limit = config.max_frame_size
        if self._life.state is not OPEN:
            self._abandon(message)
        elif config.max_attempts and frame.attempts > config.max_attempts:
            log.error(
                "%s: giving up on message %s (FIN) after %d attempts: its %d bytes are "
                "more than max_frame_size=%d lets the consumer read (raise it to receive "
                "such messages)",
                session.address,
                frame.id.decode(errors="replace"),
                frame.attempts,
                frame.size,
                limit,
            )
            message.responded = "finished"
            self._given_up += 1
            self._settle(session, message, commands.fin(frame.id), True, None, count=False)
        else:
            delay = min(config.default_requeue_delay * frame.attempts, config.max_requeue_delay)
            log.error(
                "%s: message %s is %d bytes, more than max_frame_size=%d lets the "
                "consumer read: not read, requeued in %.0fs (attempt %d; given up after "
                "max_attempts=%d); raise max_frame_size to receive it",
                session.address,
                frame.id.decode(errors="replace"),
                frame.size,
                limit,
                delay,
                frame.attempts,
                config.max_attempts,
            )
            message.responded = "requeued"
            data = commands.req(frame.id, round(delay * 1000))
            self._settle(session, message, data, False, None)

    def _accept(self, session: Session, messages: list[Message], now: float) -> None:
        """Messages the consumer takes (within RDY): queued for the handlers or
        ``async for``, past ``max_attempts`` given up, requeued while leaving."""
        count = len(messages)
        self._received += count
        due = self._rdy.on_messages(session, count, now)
        if self._life.state is not OPEN:
            for message in messages:
                self._abandon(message)  # sent before nsqd read our CLS
            if session.cls is not None and session.cls.done:
                session.straggled = True
                self._straggled.set()
            return
        max_attempts = self.config.max_attempts
        if max_attempts and any(m.attempts > max_attempts for m in messages):
            assert self._handlers is not None
            for message in messages:
                if message.attempts > max_attempts:
                    session.out[message] = None
                    self._giving_up.add(message)
                    self._handlers.start_soon(self._give_up, message)
            messages = [m for m in messages if m.attempts <= max_attempts]
        self._queue.extend(messages)
        if self._handler is None:
            if self._queue_waiters:
                # One iterating task per message at most, as one at a time did.
                self._queue_waiters.unpark(count=len(messages))
        elif not self._waking and messages:
            self._wake_workers(1)
        if due:
            self._update_rdy()

    def _settle(
        self,
        session: Session,
        message: Message,
        data: bytes,
        fin: bool,
        success: bool | None,
        count: bool = True,
    ) -> None:
        """Update backoff and RDY for a settled ``message``, then queue ``data``
        (its FIN if ``fin``, else its REQ); nothing here waits.

        ``success`` feeds backoff: True a success, False a failure, None neither;
        ``count=False`` leaves the finished/requeued counters alone (give-ups).
        RDY goes first: a failure that starts a backoff queues RDY 0 before the
        REQ, or nsqd could hand the requeued message straight back.
        """
        session.out.pop(message, None)
        due = self._rdy.on_settled(session)
        if session.held:
            session.wake()
        # A success only matters to backoff while it tests the waters.
        if (
            success is not None
            and self._life.state is OPEN
            and (not success or self._backoff.state is BackoffState.TESTING)
        ):
            now = trio.current_time()
            changed = self._backoff.on_success(now) if success else self._backoff.on_failure(now)
            if changed:
                self._rdy.set_mode(self._backoff.state)
                self._backoff_wakeup.set()
                due = True
        if due:
            self._update_rdy()
        sent = session._send(data)
        if self._life.state is not OPEN:
            self._settled_event.set()  # only _drain waits for it, once CLOSING
        if sent and count:
            if fin:
                self._finished += 1
            else:
                self._requeued += 1
