"""Bad input through the front ends: the async Producer's outcome, never a crash or a hang.

hypothesis generates topics, bodies and delays (valid or not, of any type); each
is published by the async Producer, the blocking one and the asyncio one, to the
same fakensq nsqd, and all three must end the same way: published, or the same
error type.  Every client stays usable afterwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from hypothesis import event, given, settings
from hypothesis import strategies as st

import trionsq
from fakensq import NSQD
from fakensq.testing.threaded import BackgroundNode
from trionsq import aio, blocking

MAX_MSG_SIZE = 64


def mostly(
    valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """``valid`` four times in five: enough inputs get as far as nsqd."""
    return st.integers(0, 4).flatmap(lambda i: valid if i else invalid)


topics = mostly(
    st.sampled_from(["topic", "other", "t#ephemeral", "x" * 64]),
    st.one_of(
        st.text(alphabet="ab._-#", min_size=0, max_size=70),
        st.sampled_from(["bad topic", "x" * 65, "", "#", "t#e#x"]),
        st.integers(),
        st.none(),
    ),
)
# Bytes (some past nsqd's max_msg_size, some empty), sometimes not bytes.
bodies = mostly(
    st.one_of(
        st.binary(min_size=0, max_size=MAX_MSG_SIZE + 8),
        st.builds(bytearray, st.binary(max_size=10)),
    ),
    st.one_of(st.text(max_size=5), st.none(), st.integers()),
)
delays = mostly(
    st.floats(min_value=0, max_value=10),
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=32),
        st.integers(min_value=-5, max_value=10**5),
        st.just(True),
        st.text(max_size=2),
    ),
)
calls = st.one_of(
    st.tuples(st.just("publish"), topics, bodies),
    st.tuples(st.just("multi_publish"), topics, st.lists(bodies, max_size=3)),
    st.tuples(st.just("deferred_publish"), topics, bodies, delays),
)


@pytest.fixture(scope="module")
def nsqd() -> Iterator[Any]:
    with BackgroundNode(
        lambda: NSQD(tcp_address="127.0.0.1:0", http_address="", max_msg_size=MAX_MSG_SIZE),
        name="fakensq-bad-input",
    ) as node:
        yield node


@pytest.fixture(scope="module")
def clients(nsqd: Any) -> Iterator[tuple[blocking.Producer, AioRunner]]:
    with blocking.Producer([nsqd.tcp_address], connect_timeout=5) as producer:
        runner = AioRunner(nsqd.tcp_address)
        try:
            yield producer, runner
        finally:
            runner.close()


class AioRunner:
    """An asyncio loop and an aio.Producer kept open across examples."""

    def __init__(self, address: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.producer = aio.Producer([address], connect_timeout=5)
        self.loop.run_until_complete(self.producer.__aenter__())

    def call(self, method: str, *args: Any) -> object:
        async def go() -> None:
            async with asyncio.timeout(10):
                await getattr(self.producer, method)(*args)

        return outcome_of(lambda: self.loop.run_until_complete(go()))

    def close(self) -> None:
        self.loop.run_until_complete(self.producer.aclose())
        self.loop.close()


def outcome_of(fn: Any) -> object:
    try:
        fn()
    except Exception as exc:
        return type(exc)
    return "ok"


def async_outcome(address: str, method: str, *args: Any) -> object:
    async def go() -> None:
        async with trionsq.Producer([address], connect_timeout=5) as producer:
            with trio.fail_after(10):
                await getattr(producer, method)(*args)

    # On a thread of its own: this thread holds the aio Producer's guest run
    # (Trio allows one run per thread).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(outcome_of, lambda: trio.run(go)).result()


@settings(max_examples=80)
@given(call=calls)
def test_the_front_ends_end_bad_input_as_the_async_producer(
    nsqd: Any, clients: tuple[blocking.Producer, AioRunner], call: tuple[Any, ...]
) -> None:
    producer, aio_runner = clients
    method, *args = call
    expected = async_outcome(nsqd.tcp_address, method, *args)
    event(f"{method}: {getattr(expected, '__name__', expected)}")
    got_blocking = outcome_of(lambda: getattr(producer, method)(*args, timeout=10))
    got_aio = aio_runner.call(method, *args)
    assert got_blocking == expected, (call, got_blocking, expected)
    assert got_aio == expected, (call, got_aio, expected)
    # Still usable, whatever happened.
    producer.publish("topic", b"fine", timeout=10)
    assert aio_runner.call("publish", "topic", b"fine") == "ok"


def test_bad_requeue_delays_are_refused_in_the_calling_thread(nsqd: Any) -> None:
    with blocking.Producer([nsqd.tcp_address]) as producer:
        producer.publish("requeues", b"x")
    with blocking.Consumer("requeues", "c", nsqd_tcp_addresses=[nsqd.tcp_address]) as consumer:
        message = next(iter(consumer))
        for delay in (-1, math.nan, "soon", True):
            with pytest.raises(ValueError, match="requeue delay"):
                message.requeue(delay)  # type: ignore[arg-type]
        assert message.responded is None
        message.finish()


def test_bad_options_are_refused_at_construction() -> None:
    with pytest.raises(ValueError):
        blocking.Producer([])
    with pytest.raises(TypeError):
        blocking.Producer(["127.0.0.1:4150"], no_such_option=1)
    with pytest.raises(ValueError):
        blocking.Producer(["127.0.0.1:4150"], after_fork="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        blocking.Consumer("bad topic", "c", nsqd_tcp_addresses=["127.0.0.1:4150"])
    with pytest.raises(ValueError):
        blocking.Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], concurrency=0)
    with pytest.raises(TypeError):
        blocking.Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], handler=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        aio.Consumer("t", "c")  # neither nsqd nor lookupd addresses
    with pytest.raises(TypeError):
        aio.Producer(["127.0.0.1:4150"], max_in_flight="many")
