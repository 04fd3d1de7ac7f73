"""Leaving a Consumer is prompt and loses nothing, on fakensq and on the real nsqd.

Every test checks through nsqd's ``/stats`` that after the ``async with`` nothing
of the consumer is in flight and nothing timed out: nsqd keeps the default
msg_timeout (60 s), so a message the consumer left behind would stay in flight
long after the test looks.  Exit times are checked against ``close_timeout``
(30 s) with a wide margin: they show the consumer did not wait for what cannot
happen, not how fast it is.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import trio

import trionsq

from ..support.waiting import wait_until
from . import daemons
from .daemons import Daemons, Nsqd, nothing_in_flight, publish

#: Far below close_timeout: leaving did not wait for it.
PROMPT = 5.0


def consumer(nsqds: list[Nsqd], **options: Any) -> trionsq.Consumer:
    options.setdefault("close_timeout", 30.0)
    return daemons.consumer(nsqds, **options)


async def redeliver_all(nsqds: list[Nsqd], count: int) -> list[trionsq.Message]:
    """Consume ``count`` messages with a fresh consumer (finishing them)."""
    got: list[trionsq.Message] = []
    async with consumer(nsqds, handler=got.append, max_in_flight=10):
        await wait_until(lambda: len(got) >= count)
    return got


async def test_breaking_out_of_async_for_requeues_at_once(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"a", b"b", b"c"])
    async with consumer([nsqd], max_in_flight=3) as c:
        async for message in c:  # noqa: B007 - the loop hands it out
            break  # handed out, never answered
        await wait_until(lambda: c.stats.received == 3)  # two more wait in the consumer
        left = trio.current_time()
    assert trio.current_time() - left < PROMPT
    assert message.responded == "requeued"
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["timeout_count"] == 0 and channel["requeue_count"] == 3
    assert channel["depth"] == 3  # REQ 0: back at once, not deferred
    again = await redeliver_all([nsqd], 3)
    assert sorted(m.body for m in again) == [b"a", b"b", b"c"]
    assert all(m.attempts == 2 for m in again)


async def test_async_for_answers_given_in_the_block_stand(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"1", b"2", b"3", b"4"])
    async with consumer([nsqd], max_in_flight=4) as c:
        held = []
        async for message in c:
            held.append(message)
            if len(held) == 4:
                break
        await held[0].finish()
        await held[1].requeue(60, backoff=False)
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["timeout_count"] == 0
    assert channel["requeue_count"] == 3  # one by the block, two on leaving
    assert channel["deferred_count"] == 1  # the block's REQ kept its delay
    assert channel["depth"] == 2


async def test_handler_cancelled_by_the_enclosing_nursery(daemons: Daemons) -> None:
    # The reported case: three nsqds, max_in_flight=2, handlers cancelled
    # mid-message by the nursery around the consumer.
    nsqds = [await daemons.nsqd() for _ in range(3)]
    for index, nsqd in enumerate(nsqds):
        await publish(nsqd, "topic", [b"%d-%d" % (index, i) for i in range(5)])
    entered: list[trionsq.Message] = []

    async def handler(message: trionsq.Message) -> None:
        entered.append(message)
        await trio.sleep_forever()

    c = consumer(nsqds, handler=handler, max_in_flight=2)
    async with trio.open_nursery() as outer:

        async def consume() -> None:
            async with c:
                await trio.sleep_forever()

        outer.start_soon(consume)
        # Every nsqd subscribed (one still in its handshake would never see a
        # SUB, and have no channel for the checks below).
        await wait_until(lambda: len(entered) == 2 and len(c.connections) == 3)
        cancelled = trio.current_time()
        outer.cancel_scope.cancel()
    assert trio.current_time() - cancelled < PROMPT
    assert all(m.responded == "requeued" for m in entered)
    channels = [await nothing_in_flight(n, "topic", "chan") for n in nsqds]
    # Every message received went back: the two held by the cancelled
    # handlers, and any received meanwhile and waiting for a handler (a
    # connection whose RDY was just lowered can still deliver what nsqd sent
    # under the old one).
    assert c.stats.finished == 0
    assert sum(ch["requeue_count"] for ch in channels) == c.stats.requeued == c.stats.received
    assert sum(ch["timeout_count"] for ch in channels) == 0
    assert sum(ch["depth"] for ch in channels) == 15


async def test_async_for_cancelled_by_the_enclosing_scope(daemons: Daemons) -> None:
    nsqds = [await daemons.nsqd() for _ in range(2)]
    for index, nsqd in enumerate(nsqds):
        await publish(nsqd, "topic", [b"%d-%d" % (index, i) for i in range(5)])
    held: list[trionsq.Message] = []
    with trio.move_on_after(30) as scope:
        async with consumer(nsqds, max_in_flight=4) as c:
            # Both nsqds subscribed before the loop is cancelled.  (Iterating
            # at once, the loop could be cancelled while one connection was
            # still in its handshake: that nsqd then never saw a SUB, so had
            # no channel for the check below; a test of its own below.)
            await wait_until(lambda: len(c.connections) == 2)
            async for message in c:
                held.append(message)
                if len(held) == 2:
                    cancelled = trio.current_time()
                    scope.cancel()  # e.g. a deadline: the loop body is cancelled
                    await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() - cancelled < PROMPT
    channels = [await nothing_in_flight(n, "topic", "chan") for n in nsqds]
    assert sum(c["timeout_count"] for c in channels) == 0
    assert sum(c["depth"] for c in channels) == 10


async def test_cancelled_while_an_nsqd_is_still_in_its_handshake(daemons: Daemons) -> None:
    # An nsqd that accepts the connection and never answers IDENTIFY (a hung
    # or overloaded one): a consumer cancelled meanwhile leaves at once (not
    # after connect_timeout), requeues what the other nsqd delivered, and
    # never subscribes to the silent one.
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"1", b"2", b"3"])
    accepted: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:
        serve = functools.partial(
            trio.serve_tcp, functools.partial(_hold, accepted=accepted), 0, host="127.0.0.1"
        )
        (listener,) = await nursery.start(serve)
        silent = f"127.0.0.1:{listener.socket.getsockname()[1]}"
        held: list[trionsq.Message] = []
        with trio.move_on_after(30) as scope:
            async with trionsq.Consumer(
                "topic",
                "chan",
                nsqd_tcp_addresses=[silent, nsqd.tcp_address],
                max_in_flight=3,
                close_timeout=30.0,
                connect_timeout=30.0,
            ) as c:
                await wait_until(lambda: accepted and c.stats.received == 3)
                async for message in c:
                    held.append(message)
                    cancelled = trio.current_time()
                    scope.cancel()
                    await trio.sleep_forever()
        assert scope.cancelled_caught
        assert trio.current_time() - cancelled < PROMPT
        assert held[0].responded == "requeued"
        channel = await nothing_in_flight(nsqd, "topic", "chan")
        assert channel["timeout_count"] == 0 and channel["requeue_count"] == 3
        assert channel["depth"] == 3
        # What the consumer sent the silent nsqd: the handshake, nothing more.
        with trio.fail_after(10):
            sent = b""
            while chunk := await accepted[0].receive_some():
                sent += chunk
        assert sent.startswith(b"  V2IDENTIFY\n") and b"SUB" not in sent
        nursery.cancel_scope.cancel()


async def _hold(stream: trio.SocketStream, *, accepted: list[trio.SocketStream]) -> None:
    accepted.append(stream)
    await trio.sleep_forever()


async def test_running_handlers_get_close_timeout_then_are_requeued(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"quick", b"slow", b"stuck"])
    started: set[bytes] = set()

    async def handler(message: trionsq.Message) -> None:
        started.add(message.body)
        if message.body == b"slow":
            await trio.sleep(0.3)
        elif message.body == b"stuck":
            await trio.sleep_forever()

    async with consumer([nsqd], handler=handler, max_in_flight=3, close_timeout=1.0) as c:
        await wait_until(lambda: len(started) == 3 and c.stats.finished == 1)
        left = trio.current_time()
    elapsed = trio.current_time() - left
    # "slow" finished during the wait; "stuck" was cancelled at close_timeout.
    assert 1.0 <= elapsed < 1.0 + PROMPT
    assert c.stats.finished == 2 and c.stats.requeued == 1
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["timeout_count"] == 0 and channel["requeue_count"] == 1
    (again,) = await redeliver_all([nsqd], 1)
    assert (again.body, again.attempts) == (b"stuck", 2)


async def test_leaving_waits_only_for_handlers_that_can_still_answer(daemons: Daemons) -> None:
    # A handler holding a message of an nsqd that was SIGKILLed cannot answer
    # it: leaving does not wait close_timeout for it.
    doomed = await daemons.nsqd()
    other = await daemons.nsqd()
    await publish(doomed, "topic", [b"from-doomed"])
    entered = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        entered.set()
        await trio.sleep_forever()

    async with consumer([doomed, other], handler=handler, max_in_flight=4) as c:
        await entered.wait()
        await doomed.kill()
        await wait_until(lambda: c.connections == [other.tcp_address])
        left = trio.current_time()
    assert trio.current_time() - left < PROMPT
    channel = await nothing_in_flight(other, "topic", "chan")
    assert channel["timeout_count"] == 0


async def test_keyboard_interrupt_in_the_block_leaves_promptly(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"x", b"y"])
    entered = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        entered.set()
        await trio.sleep_forever()

    with pytest.raises(KeyboardInterrupt):  # unchanged, not in a group
        async with consumer([nsqd], handler=handler, max_in_flight=2):
            await entered.wait()
            interrupted = trio.current_time()
            raise KeyboardInterrupt
    assert trio.current_time() - interrupted < PROMPT
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["timeout_count"] == 0 and channel["depth"] == 2


async def test_keyboard_interrupt_in_a_handler_leaves_promptly(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"wait", b"interrupt"])
    waiting = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        if message.body == b"wait":
            waiting.set()
            await trio.sleep_forever()
        await waiting.wait()
        raise KeyboardInterrupt  # as a Ctrl-C landing in a handler's code

    with pytest.raises(KeyboardInterrupt):
        async with consumer([nsqd], handler=handler, max_in_flight=2):
            await trio.sleep_forever()
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["timeout_count"] == 0 and channel["depth"] == 2


async def test_an_error_in_the_block_propagates_unchanged(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"x"])
    with pytest.raises(ValueError, match="boom"):
        async with consumer([nsqd], max_in_flight=1) as c:
            async for _message in c:
                raise ValueError("boom")
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["timeout_count"] == 0 and channel["depth"] == 1


SIGINT_SCRIPT = textwrap.dedent(
    """
    import signal, sys, trio, trionsq

    # As a program started from a terminal: Python leaves SIGINT ignored when
    # it inherits it so (a suite run in the background by a shell without
    # job control), and Ctrl-C would then do nothing at all.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    async def main(address, mode):
        async def handler(message):
            print("holding", flush=True)
            await trio.sleep_forever()

        if mode == "handler":
            async with trionsq.Consumer(
                "topic", "chan", nsqd_tcp_addresses=[address], handler=handler,
                max_in_flight=3, close_timeout=30,
            ):
                await trio.sleep_forever()
        else:
            async with trionsq.Consumer(
                "topic", "chan", nsqd_tcp_addresses=[address], max_in_flight=3, close_timeout=30,
            ) as consumer:
                async for message in consumer:
                    print("holding", flush=True)
                    await trio.sleep_forever()

    trio.run(main, sys.argv[1], sys.argv[2])
    """
)


@pytest.mark.parametrize("mode", ["handler", "iterate"])
async def test_ctrl_c_leaves_promptly(daemons: Daemons, mode: str) -> None:
    # A real SIGINT to a process consuming: it exits with KeyboardInterrupt,
    # promptly, and leaves nothing in flight.
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"1", b"2", b"3"])
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", SIGINT_SCRIPT, nsqd.tcp_address, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        with trio.fail_after(30):
            seen = b""
            while b"holding" not in seen:
                chunk = await process.stdout.receive_some()
                assert chunk, "the consumer process ended early"
                seen += chunk
            interrupted = trio.current_time()
            process.send_signal(signal.SIGINT)
            await process.wait()
        assert trio.current_time() - interrupted < PROMPT
        errors = b""
        while chunk := await process.stderr.receive_some():
            errors += chunk
        assert b"KeyboardInterrupt" in errors, errors.decode(errors="replace")
        assert b"ExceptionGroup" not in errors, errors.decode(errors="replace")
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["timeout_count"] == 0 and channel["depth"] == 3
