"""Handing work between a Trio loop on its own thread and the threads around it.

Two small pieces the front ends (:mod:`trionsq.blocking`, :mod:`trionsq.aio`) are
built from:

- :class:`Inbox`: items put from any thread, taken by tasks in the loop.  A put
  wakes the loop (a write to its wake-up socket) only when no task of the loop
  is going to look at the inbox anyway, so a stream of puts costs one wake-up
  per batch, not one per item.
- :class:`Waiter`: the outcome of one piece of work, waited for by one thread.
- :class:`LightFuture`: a :class:`concurrent.futures.Future` that costs no lock
  until somebody waits on it (most are only looked at once done).
- :class:`LoopPost`: items from the Trio loop's thread into an asyncio loop, a
  batch per ``call_soon_threadsafe`` rather than one call per item.
- :class:`Handout`: items from the Trio loop's thread to the threads that take
  them, the sleeping ones woken once per batch rather than once per item.

Both rely on the GIL making single deque operations and attribute stores
atomic; the one check-then-act race (a put racing a taker going to sleep) is
closed by the order of the steps, described at :meth:`Inbox.put`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures._base import FINISHED, RUNNING
from typing import Any, Generic, TypeVar

import trio
import trio.lowlevel

__all__ = ["Handout", "Inbox", "LightFuture", "LoopPost", "Waiter"]

T = TypeVar("T")


class Inbox(Generic[T]):
    """A FIFO from any thread into a Trio loop.

    ``wake_loop(fn)`` is how a put gets the loop's attention from another thread
    (``TrioThread.run_sync_soon``); ``fn`` is ``on_wake``, run in the loop, by
    default waking the task parked in :meth:`wait`.  Owners with several takers
    pass their own ``on_wake`` and manage :attr:`awake` themselves, keeping the
    rule stated at :meth:`put`.
    """

    def __init__(
        self,
        wake_loop: Callable[[Callable[[], None]], None],
        on_wake: Callable[[], None] | None = None,
    ) -> None:
        self.items: deque[T] = deque()
        self._wake_loop = wake_loop
        self._on_wake = on_wake if on_wake is not None else self._unpark
        self._lot = trio.lowlevel.ParkingLot()
        #: True while a wake-up is on its way or a task of the loop will look at
        #: ``items`` before it sleeps: puts then need not wake the loop.
        self.awake = False
        self.closed = False

    def __len__(self) -> int:
        return len(self.items)

    def put(self, item: T) -> None:
        """Add ``item`` (any thread, never blocks).

        The rule that keeps an item from being stranded: a put appends before it
        reads :attr:`awake`, and a taker clears :attr:`awake` before its last
        look at the items; so either the taker sees the item, or the put sees
        :attr:`awake` cleared and wakes the loop.
        """
        self.items.append(item)
        if not self.awake:
            self.wake()

    def wake(self) -> None:
        """The second half of :meth:`put`, for callers that inline the first
        (append, then call this if :attr:`awake` is false)."""
        self.awake = True
        self._wake_loop(self._on_wake)

    def _unpark(self) -> None:
        self._lot.unpark_all()

    async def wait(self) -> None:
        """In the loop, for a single taker: return once there is an item (or
        the inbox is closed)."""
        while not self.items and not self.closed:
            self.awake = False
            if self.items:  # put between the check above and the store
                break
            await self._lot.park()
        self.awake = True

    def close(self) -> None:
        """In the loop: :meth:`wait` returns from now on, items or not."""
        self.closed = True
        self._lot.unpark_all()


class Waiter(Generic[T]):
    """One outcome, set once from the loop, waited for by one thread."""

    __slots__ = ("_done", "error", "value")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self.value: T | None = None
        self.error: BaseException | None = None

    def set_result(self, value: T) -> None:
        self.value = value
        self._done.release()

    def set_exception(self, error: BaseException) -> None:
        self.error = error
        self._done.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the outcome is set (True) or ``timeout`` passes (False).

        A signal handler's exception (``KeyboardInterrupt``) interrupts the wait.
        """
        return self._done.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))

    def unwrap(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


#: guards the creation of a LightFuture's condition (rare: only a waiter creates it)
_CONDITION_MADE = threading.Lock()


class LightFuture(concurrent.futures.Future[T]):
    """A :class:`concurrent.futures.Future`, running from the start, completed
    once by the client's loop, without a lock until somebody waits.

    The standard future builds a ``threading.Condition`` (an RLock and more)
    when created and takes it on every call: several microseconds a publish,
    most of a ``publish_async``'s cost.  Here the condition is made by the
    first caller that needs it (``result()`` or ``exception()`` on a future not
    done yet, ``add_done_callback``, ``concurrent.futures.wait`` and
    ``as_completed``, which all reach it through :attr:`_condition`).

    Why no completion is missed without the lock: the completer stores the
    state, then looks for a condition; a waiter stores the condition, then
    looks at the state (under it).  Under the GIL these steps are sequentially
    consistent, so at least one sees the other's store: either the waiter
    sees the future done, or the completer sees the condition and notifies
    under it (as the standard future does).  Only the loop completes it;
    a second completion is ignored rather than raised (it would be raised in
    the loop).
    """

    def __init__(self) -> None:  # the base __init__ would build the condition
        self._state = RUNNING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []
        self._lazy_condition: threading.Condition | None = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        condition = self._lazy_condition
        if condition is None:
            with _CONDITION_MADE:
                condition = self._lazy_condition
                if condition is None:
                    condition = self._lazy_condition = threading.Condition()
        return condition

    def done(self) -> bool:
        return self._state == FINISHED or super().done()

    def result(self, timeout: float | None = None) -> T:
        if self._state == FINISHED:  # the common case: no condition needed
            if self._exception is not None:
                raise self._exception
            return self._result  # type: ignore[no-any-return]
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def set_result(self, result: T) -> None:
        if self._state == FINISHED:
            return
        self._result = result
        self._complete()

    def set_exception(self, exception: BaseException | None) -> None:
        if self._state == FINISHED:
            return
        self._exception = exception
        self._complete()

    def _complete(self) -> None:
        self._state = FINISHED  # before looking for a condition: see the class doc
        condition = self._lazy_condition
        if condition is not None:
            with condition:
                for waiter in self._waiters:
                    if self._exception is None:
                        waiter.add_result(self)
                    else:
                        waiter.add_exception(self)
                condition.notify_all()
        if self._done_callbacks:
            self._invoke_callbacks()  # type: ignore[attr-defined]


class LoopPost(Generic[T]):
    """Items put from any thread, handed in batches to a callback in an asyncio loop.

    A put schedules a flush (``call_soon_threadsafe``) only when none is
    pending: the flush clears the flag before it takes the items, and a put
    appends before it reads the flag, so no item is left behind.  ``on_items``
    receives the shared deque and must pop items from its left until it is
    empty (a put may add more meanwhile: it takes those too), unless its owner
    passed the deque (``items``) and takes them from it as it goes, the flush
    being only its cue.  Puts after the asyncio loop closed are dropped (nobody
    is left to receive them).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_items: Callable[[deque[T]], None],
        items: deque[T] | None = None,
    ) -> None:
        self._loop = loop
        self._on_items = on_items
        #: the items not flushed yet (``items.append`` is :meth:`add`, without a call)
        self._items: deque[T] = deque() if items is None else items
        self._scheduled = False
        #: the thread that made it (``threading.get_ident()``): an asyncio
        #: front end makes its posts in its loop's thread
        self.made_in = threading.get_ident()

    def put(self, item: T) -> None:
        self._items.append(item)
        if not self._scheduled:
            self.schedule()

    def add(self, item: T) -> None:
        """Append without waking the asyncio loop: call :meth:`schedule` after
        the last item of a batch (one wake-up for the batch)."""
        self._items.append(item)

    def schedule(self) -> None:
        """Have the asyncio loop take the items (unless it is about to)."""
        if self._scheduled:
            return
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed
            pass

    def _flush(self) -> None:
        self._scheduled = False
        self._on_items(self._items)

    def take_all(self) -> list[T]:
        """In the asyncio loop: the items not flushed yet (they will not be)."""
        taken: list[T] = []
        items = self._items
        while items:
            taken.append(items.popleft())
        return taken


class Handout(Generic[T]):
    """Items handed from the client's loop to the threads that take them.

    The loop appends a batch to :attr:`items` (no wake-up per item) and then
    calls :meth:`wake` once; takers pop from the left and sleep, each on a lock
    of its own, only when there is nothing to take.  A taker registers its lock
    before its last look at the items, and :meth:`wake` reads the items after
    they were appended: so either the taker sees an item, or the waker sees the
    taker asleep and wakes it (as many sleepers as there are items).
    """

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        self._sleepers: deque[threading.Lock] = deque()

    def put(self, item: T) -> None:
        """Add one item and wake a taker (any thread, even a signal handler)."""
        self.items.append(item)
        self.wake()

    def wake(self, most: int | None = None) -> None:
        """Wake as many sleeping takers as there are items, or ``most`` (any
        thread).  Waking fewer is for takers that go on taking while there
        are items: a woken one takes the others' too (a wake-up costs its
        thread switch and a turn of the GIL); the waker must wake the others
        later if the items are still there then."""
        sleepers = self._sleepers
        count = len(self.items)
        if most is not None and most < count:
            count = most
        while count and sleepers:
            try:
                sleepers.popleft().release()
            except IndexError:  # another waker took the last one
                return
            count -= 1

    def get(self, timeout: float | None = None) -> T:
        """Take the oldest item, waiting for one up to ``timeout`` seconds
        (``None``: for ever); raises :class:`queue.Empty` after the timeout."""
        items = self.items
        try:
            return items.popleft()
        except IndexError:
            pass
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sleep = threading.Lock()
            sleep.acquire()
            self._sleepers.append(sleep)
            try:
                item = items.popleft()  # appended before we were there to be woken
            except IndexError:
                pass
            else:
                # Not asleep after all: a wake-up must not be spent on our lock
                # (the sleeper it passed over would sleep on with items waiting).
                try:
                    self._sleepers.remove(sleep)
                except ValueError:  # a waker chose us already: we took an item
                    pass
                return item
            try:
                woken = sleep.acquire(
                    timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())
                )
            except BaseException:  # KeyboardInterrupt: a wake-up must not go to us
                self._forget(sleep)
                raise
            if not woken:
                self._forget(sleep)
                try:
                    return items.popleft()
                except IndexError:
                    raise queue.Empty from None
            try:
                return items.popleft()
            except IndexError:  # taken by a taker that was awake: sleep again
                continue

    def _forget(self, sleep: threading.Lock) -> None:
        try:
            self._sleepers.remove(sleep)
        except ValueError:  # a waker chose us as we gave up: pass the wake-up on
            self.wake()

    def take_all(self) -> list[T]:
        """Every item not taken yet (they will not be)."""
        taken: list[T] = []
        items = self.items
        while True:
            try:
                taken.append(items.popleft())
            except IndexError:
                return taken
