"""A channel: one consumer group's copy of a topic's stream.

Messages wait in the channel's queue until a subscribed client has RDY to
spare; then they are in flight (with a timeout) until FIN, REQ or the timeout.
REQ with a delay and DPUB put them in the deferred set until they are due.

All timers are one Trio task per channel sleeping until the earliest deadline
(in-flight timeout or deferred due time) is acted on, woken when an earlier one
appears; no polling, so virtual time (``trio.testing.MockClock``) drives it
exactly.  When a deadline is acted on is nsqd's rule (:meth:`~fakensq.nsqd.node.NSQD.scan_time`):
at its queue scan's next tick, and not before the scan knows the channel.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from trionsq.protocol.errors import FinFailedError, ReqFailedError, TouchFailedError
from trionsq.protocol.names import is_ephemeral

from .message import Message, MessageQueue
from .stats import LatencyStream

if TYPE_CHECKING:
    from .client import ClientConnection
    from .owner import ChannelOwner
    from .topic import Topic

__all__ = ["Channel"]

# A heap entry is a deadline, the ``seq`` of the messages it was made for, and
# their ids: one entry for the whole batch a delivery puts in flight (they share
# their deadline), so a message costs no heap operation of its own.  Ids, not
# messages, keep the entries out of reach of reference cycles.  An id whose
# message is no longer there with that ``seq`` (finished, requeued, touched
# since) is skipped when the entry comes due: FIN costs no heap work at all.
_Entry = tuple[float, int, list[bytes]]


class Channel:
    """A channel of a topic; created by SUB or ``/channel/create``."""

    def __init__(self, topic: Topic, name: str, nsqd: ChannelOwner) -> None:
        self.topic = topic
        self.name = name
        self.nsqd = nsqd
        self.ephemeral = is_ephemeral(name)
        self.queue: MessageQueue = nsqd.new_queue(topic.name, name)
        self.clients: dict[int, ClientConnection] = {}
        self.in_flight: dict[bytes, Message] = {}
        self.deferred: dict[bytes, Message] = {}
        self._in_flight_heap: list[_Entry] = []
        self._in_flight_heap_ids = 0  # ids in the entries, live and stale
        self._deferred_heap: list[_Entry] = []
        self._seq = itertools.count(1)
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.finished_count = 0  # not in nsqd's stats; for accounting in tests
        self.e2e = LatencyStream(nsqd.options)
        self._timer_target = math.inf
        self._timer_wake = trio.Event()
        self._cancel_scope = trio.CancelScope()
        #: When nsqd's queue scan first looks at this channel (trio clock).
        self.scanned_from = nsqd.scan_known_from()

    def __repr__(self) -> str:
        return f"Channel({self.topic.name}:{self.name})"

    # --- queue side ---

    def depth(self) -> int:
        return len(self.queue)

    def put(self, msg: Message) -> None:
        """A new message from the topic."""
        self.put_many([msg])

    def put_many(self, msgs: Sequence[Message]) -> None:
        self.message_count += len(msgs)
        if self.ephemeral:
            for msg in msgs:
                self._requeue(msg)
        else:
            self.queue.put_many(msgs)
        self.dispatch()

    def put_deferred(self, msg: Message, delay: float) -> None:
        """A DPUB message from the topic, due after ``delay`` seconds."""
        self.message_count += 1
        self._start_deferred(msg, delay)

    def _requeue(self, msg: Message) -> None:
        msg.client = None
        if self.ephemeral and len(self.queue) >= self.nsqd.options.mem_queue_size:
            # nsqd's ephemeral channels have no disk behind their memory queue:
            # what does not fit is dropped (once ready clients had their share).
            self.dispatch()
            if len(self.queue) >= self.nsqd.options.mem_queue_size:
                return
        self.queue.put(msg)

    # --- delivery ---

    def dispatch(self) -> None:
        """Hand queued messages to clients with RDY to spare.

        Each message goes to a ready client chosen at random (seeded), as nsqd's
        clients race for its channel's queue; each client then gets its share in
        one batch.
        """
        if self.paused or self.exiting or not self.clients or not self.queue:
            return
        capacity = {
            c: c.ready_count - c.in_flight_count
            for c in self.clients.values()
            if c.is_ready_for_messages()
        }
        if not capacity:
            return
        now = trio.current_time()
        batches: dict[ClientConnection, list[Message]] = {}
        if len(capacity) == 1:
            ((client, room),) = capacity.items()
            if client.sample_rate == 0:
                # The common case: one consumer, no sampling.
                batch = self.queue.get_many(room)
                self._start_in_flight(batch, client, now)
                client.send_messages(batch)
                return
        rng = self.nsqd.rng
        queue = self.queue
        ready = list(capacity)
        while ready:
            msg = queue.get()
            if msg is None:
                break
            client = ready[0] if len(ready) == 1 else rng.choice(ready)
            # nsqd's messagePump: a sampled-out message is simply dropped for this
            # channel (taken off the queue and never sent).
            if client.sample_rate > 0 and rng.randrange(100) > client.sample_rate:
                continue
            share = batches.get(client)
            if share is None:
                share = batches[client] = []
            share.append(msg)
            room = capacity[client] - 1
            capacity[client] = room
            if room <= 0:
                ready.remove(client)
        for client, batch in batches.items():
            self._start_in_flight(batch, client, now)
            client.send_messages(batch)

    def _start_in_flight(self, batch: list[Message], client: ClientConnection, now: float) -> None:
        if not batch:
            return
        in_flight = self.in_flight
        deadline = now + client.msg_timeout
        n = next(self._seq)
        ids: list[bytes] = []
        add = ids.append
        for msg in batch:
            msg.attempts += 1
            msg.client = client
            msg.delivery_ts = now
            msg.deadline = deadline
            msg.seq = n
            msg_id = msg.id
            in_flight[msg_id] = msg
            add(msg_id)
        self._push_in_flight(deadline, n, ids)

    def _push_in_flight(self, deadline: float, seq: int, ids: list[bytes]) -> None:
        heapq.heappush(self._in_flight_heap, (deadline, seq, ids))
        self._in_flight_heap_ids += len(ids)
        if self._in_flight_heap_ids > 1024 and self._in_flight_heap_ids > 4 * len(self.in_flight):
            self._compact_in_flight()
        self._schedule(deadline)

    def _pop_in_flight(self, client: ClientConnection, msg_id: bytes, verb: str) -> Message:
        msg = self.in_flight.get(msg_id)
        error = {"FIN": FinFailedError, "REQ": ReqFailedError, "TOUCH": TouchFailedError}[verb]
        text_id = msg_id.decode("latin-1")
        if msg is None:
            raise error(f"{verb} {text_id} failed ID not in flight")
        if msg.client is not client:
            raise error(f"{verb} {text_id} failed client does not own message")
        del self.in_flight[msg_id]
        return msg

    def finish_many(self, client: ClientConnection, ids: list[bytes], start: int = 0) -> int:
        """FIN ``ids[start:]`` in order, handing out no new messages (the caller
        will).  Stops at the first that fails: returns its index (the caller
        gets its error from :meth:`finish`), or -1 when all were finished."""
        in_flight = self.in_flight
        get = in_flight.get
        e2e = self.e2e.enabled
        failed = -1
        index = start
        for msg_id in ids[start:] if start else ids:
            msg = get(msg_id)
            if msg is None or msg.client is not client:
                failed = index
                break
            del in_flight[msg_id]
            msg.client = None
            if e2e:
                self.e2e.add(msg.timestamp)
                self.topic.e2e.add(msg.timestamp)
            index += 1
        done = index - start
        self.finished_count += done
        client.finish_count += done
        client.in_flight_count -= done
        return failed

    def finish(self, client: ClientConnection, msg_id: bytes, dispatch: bool = True) -> None:
        """FIN: the message is done (``dispatch=False``: hand out no new messages
        yet, the caller will)."""
        msg = self.in_flight.get(msg_id)
        if msg is None or msg.client is not client:
            self._pop_in_flight(client, msg_id, "FIN")  # raises the right error
            return
        del self.in_flight[msg_id]
        msg.client = None
        if self.e2e.enabled:
            self.e2e.add(msg.timestamp)
            self.topic.e2e.add(msg.timestamp)
        self.finished_count += 1
        client.finish_count += 1
        client.in_flight_count -= 1
        if dispatch:
            self.dispatch()

    def requeue(
        self,
        client: ClientConnection,
        msg_id: bytes,
        delay: float,
        hold: list[Message] | None = None,
    ) -> None:
        """REQ: back to the queue now (delay 0), or deferred.  With ``hold``, a
        message for the queue now is appended there instead, for the caller to
        :meth:`put_back` later (nsqd's REQ passes through its channel queue,
        so the message is not in flight again before the next command)."""
        msg = self._pop_in_flight(client, msg_id, "REQ")
        self.requeue_count += 1
        client.requeued_message()
        msg.client = None
        if delay > 0:
            self._start_deferred(msg, delay)
        elif hold is not None:
            hold.append(msg)
            return
        else:
            self._requeue(msg)
        self.dispatch()

    def put_back(self, msgs: list[Message]) -> None:
        """Requeue messages a :meth:`requeue` held (unless the channel is gone)."""
        if self.exiting:
            return
        for msg in msgs:
            self._requeue(msg)
        self.dispatch()

    def touch(self, client: ClientConnection, msg_id: bytes) -> None:
        """TOUCH: restart the in-flight timeout, never past max-msg-timeout."""
        msg = self._pop_in_flight(client, msg_id, "TOUCH")
        now = trio.current_time()
        deadline = now + client.msg_timeout
        max_timeout = self.nsqd.options.max_msg_timeout
        if deadline - msg.delivery_ts >= max_timeout:
            deadline = msg.delivery_ts + max_timeout
        msg.deadline = deadline
        msg.seq = next(self._seq)
        self.in_flight[msg.id] = msg
        self._push_in_flight(deadline, msg.seq, [msg.id])

    def time_out(self, msgs: list[Message], now: float) -> None:
        """Make in-flight ``msgs`` due now, and act on it: they take the normal
        timeout path (fault injection's ``time_out_in_flight``)."""
        for msg in msgs:
            msg.deadline = now
            msg.seq = next(self._seq)
            self._push_in_flight(now, msg.seq, [msg.id])
        self.process_timers(now)

    def _start_deferred(self, msg: Message, delay: float) -> None:
        msg.deadline = trio.current_time() + delay
        msg.seq = next(self._seq)
        self.deferred[msg.id] = msg
        heapq.heappush(self._deferred_heap, (msg.deadline, msg.seq, [msg.id]))
        self._schedule(msg.deadline)

    # --- clients ---

    def add_client(self, client: ClientConnection) -> None:
        self.clients[client.id] = client

    def remove_client(self, client: ClientConnection) -> None:
        if self.clients.pop(client.id, None) is None:
            return
        if self.nsqd.requeue_on_disconnect:
            mine = [m for m in self.in_flight.values() if m.client is client]
            for msg in mine:
                del self.in_flight[msg.id]
                self._requeue(msg)
        if self.ephemeral and not self.clients:
            self.topic.delete_channel(self.name)
            return
        self.dispatch()

    # --- admin ---

    def pause(self) -> None:
        self.paused = True
        for client in self.clients.values():
            client.ready_state_changed()

    def unpause(self) -> None:
        self.paused = False
        self.dispatch()

    def empty(self) -> None:
        """Drop every queued, in-flight and deferred message (``/channel/empty``)."""
        self.queue.clear()
        self.in_flight.clear()
        self.deferred.clear()
        self._in_flight_heap.clear()
        self._in_flight_heap_ids = 0
        self._deferred_heap.clear()
        for client in self.clients.values():
            client.in_flight_count = 0
        self.dispatch()

    def close(self) -> None:
        """Stop: the channel is deleted; its clients are disconnected."""
        self.exiting = True
        self._cancel_scope.cancel()
        for client in list(self.clients.values()):
            client.close()
        self.clients.clear()

    # --- timers ---

    def _schedule(self, deadline: float) -> None:
        if deadline < self._timer_target:
            self._timer_wake.set()

    def _compact_in_flight(self) -> None:
        # FIN leaves its id in its heap entry; rebuild once stale ids dominate so
        # memory stays proportional to what is really in flight.  Messages that
        # share a seq were put in flight together: they share an entry again.
        entries: dict[int, _Entry] = {}
        for msg in self.in_flight.values():
            entry = entries.get(msg.seq)
            if entry is None:
                entries[msg.seq] = (msg.deadline, msg.seq, [msg.id])
            else:
                entry[2].append(msg.id)
        heap = self._in_flight_heap
        heap[:] = entries.values()
        heapq.heapify(heap)
        self._in_flight_heap_ids = len(self.in_flight)

    async def run_timers(self) -> None:
        """The channel's timer task (in the nsqd's nursery, until deletion)."""
        with self._cancel_scope:
            while True:
                self.process_timers(trio.current_time())
                target = math.inf
                if self._in_flight_heap:
                    target = self._in_flight_heap[0][0]
                if self._deferred_heap:
                    target = min(target, self._deferred_heap[0][0])
                self._timer_target = target
                self._timer_wake = trio.Event()
                with trio.move_on_at(self.nsqd.scan_time(target, self.scanned_from)):
                    await self._timer_wake.wait()

    def process_timers(self, now: float) -> None:
        """Requeue timed-out in-flight messages and release due deferred ones."""
        changed = False
        heap = self._in_flight_heap
        while heap and heap[0][0] <= now:
            _, seq, ids = heapq.heappop(heap)
            self._in_flight_heap_ids -= len(ids)
            for msg_id in ids:
                msg = self.in_flight.get(msg_id)
                if msg is None or msg.seq != seq:
                    continue
                del self.in_flight[msg.id]
                self.timeout_count += 1
                client = msg.client
                if client is not None:
                    client.timed_out_message()
                self._requeue(msg)
                changed = True
        heap = self._deferred_heap
        while heap and heap[0][0] <= now:
            _, seq, ids = heapq.heappop(heap)
            for msg_id in ids:
                msg = self.deferred.get(msg_id)
                if msg is None or msg.seq != seq:
                    continue
                del self.deferred[msg.id]
                self._requeue(msg)
                changed = True
        if changed:
            self.dispatch()
