"""The hand-over pieces of trionsq.hosting.handover, alone (no nsqd, no Trio run)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import random
import threading
import time
from collections import deque

import pytest

from trionsq.hosting.handover import Handout, LightFuture


def test_a_light_future_is_a_running_concurrent_future() -> None:
    future: LightFuture[int] = LightFuture()
    assert isinstance(future, concurrent.futures.Future)
    assert future.running() and not future.done() and not future.cancelled()
    assert not future.cancel()  # handed over: it cannot be taken back
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0)
    future.set_result(5)
    assert future.done() and not future.running()
    assert future.result() == 5 and future.exception() is None
    future.set_result(6)  # a second completion is ignored (never raised in the loop)
    assert future.result() == 5


def test_an_error_is_raised_by_result_and_returned_by_exception() -> None:
    future: LightFuture[None] = LightFuture()
    error = ValueError("refused")
    future.set_exception(error)
    assert future.exception() is error
    with pytest.raises(ValueError, match="refused"):
        future.result()


def test_callbacks_run_once_whenever_they_are_added() -> None:
    future: LightFuture[str] = LightFuture()
    seen: list[str] = []
    future.add_done_callback(lambda f: seen.append("before:" + f.result()))
    future.set_result("x")
    future.add_done_callback(lambda f: seen.append("after:" + f.result()))
    assert seen == ["before:x", "after:x"]


def test_waiters_of_every_kind_are_woken_from_another_thread() -> None:
    futures: list[LightFuture[int]] = [LightFuture() for _ in range(4)]
    started = threading.Event()

    def complete() -> None:
        started.wait(10)
        futures[0].set_result(0)
        futures[1].set_exception(KeyError("k"))
        futures[2].set_result(2)
        futures[3].set_result(3)

    threading.Thread(target=complete).start()
    started.set()
    done, not_done = concurrent.futures.wait(futures[:2], timeout=10)
    assert done == set(futures[:2]) and not not_done
    assert [f.result() for f in concurrent.futures.as_completed([futures[2]], timeout=10)] == [2]
    assert futures[3].result(timeout=10) == 3

    async def main() -> int:
        future: LightFuture[int] = LightFuture()
        asyncio.get_running_loop().call_later(
            0.01, lambda: threading.Thread(target=future.set_result, args=(7,)).start()
        )
        return await asyncio.wrap_future(future)

    assert asyncio.run(main()) == 7


def test_no_completion_is_missed_when_waiting_races_completing() -> None:
    # The lock-free completion against waiters arriving at every moment: each
    # future is waited on (result, wait(), callback) while another thread
    # completes it; none of the waits may hang (timeout: a missed wake-up).
    rng = random.Random(20)
    for _ in range(300):
        future: LightFuture[int] = LightFuture()
        called = threading.Event()
        spin = rng.randrange(50)

        def complete(future: LightFuture[int] = future, spin: int = spin) -> None:
            for _ in range(spin):
                pass
            future.set_result(1)

        thread = threading.Thread(target=complete)
        thread.start()
        how = rng.randrange(3)
        if how == 0:
            assert future.result(timeout=10) == 1
        elif how == 1:
            assert concurrent.futures.wait([future], timeout=10).done == {future}
        else:
            future.add_done_callback(lambda f, called=called: called.set())
            assert called.wait(10)
        thread.join()


def test_a_handout_gives_each_item_to_exactly_one_taker() -> None:
    # Batches appended without a wake-up each, then one wake() a batch, as the
    # consumer's loop does; takers of every kind (waiting for ever, in slices)
    # race for them.  Every item must arrive once; none may be stranded while a
    # taker sleeps (a missed wake-up would hang a taker that waits for ever).
    handout: Handout[int] = Handout()
    total, takers = 20_000, 4
    got: list[list[int]] = [[] for _ in range(takers)]
    end = -1

    def take(index: int) -> None:
        while True:
            try:
                item = handout.get(None if index % 2 else 0.01)
            except queue.Empty:
                continue
            if item == end:
                handout.put(end)  # for the other takers
                return
            got[index].append(item)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(takers)]
    for thread in threads:
        thread.start()
    rng = random.Random(7)
    sent = 0
    while sent < total:
        size = min(total - sent, rng.choice([1, 2, 5, 50, 300]))
        handout.items.extend(range(sent, sent + size))
        handout.wake()
        sent += size
        if rng.random() < 0.3:
            time.sleep(0)  # let the takers drain and go to sleep
    handout.put(end)
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    assert sorted(item for items in got for item in items) == list(range(total))


def test_a_handout_times_out_and_gives_back_what_is_left() -> None:
    handout: Handout[str] = Handout()
    with pytest.raises(queue.Empty):
        handout.get(0.01)
    handout.items.extend(["a", "b"])
    assert handout.get(0) == "a"
    assert handout.take_all() == ["b"] and handout.take_all() == []


def test_a_taker_that_finds_an_item_after_all_leaves_no_lock_to_wake() -> None:
    # The item lands between the taker's first look and its registration as a
    # sleeper: it takes the item on its second look, and must take its lock
    # out of the sleepers, or the next wake-up (one per item) is spent on it
    # while a real sleeper sleeps on beside an item (a consumer stalled until
    # its next slice, a handler thread for ever).
    class Racing(deque[str]):
        looks = 0

        def popleft(self) -> str:
            self.looks += 1
            if self.looks == 1:
                self.append("raced")  # put by the loop just after this look
                raise IndexError
            return super().popleft()

    handout: Handout[str] = Handout()
    handout.items = Racing()
    assert handout.get(None) == "raced"
    assert not handout._sleepers
