"""Clients created before os.fork() (gunicorn/uwsgi preloading), used in the child."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from trionsq import aio, blocking

from ..support.nodes import BlockingNode
from ..support.waiting import wait_until_blocking
from .conftest import stats

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    pytest.mark.usefixtures("no_threads_left"),
]


def in_child(work: Callable[[], str]) -> str:
    """Run ``work`` in a forked child; returns what it returned (or its error)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                report = work()
            except BaseException as exc:
                report = f"{type(exc).__name__}: {exc}"
            os.write(write, report.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return report


def test_a_producer_reconnects_in_the_child_never_sharing_the_parents_socket(
    daemon: BlockingNode,
) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.publish("topic", b"parent-before")

        def child() -> str:
            producer.publish("topic", b"child")  # a new thread and connection here
            address = producer.address
            producer.close()
            return f"ok {address}"

        assert in_child(child) == f"ok {daemon.tcp_address}"
        # The parent's connection is intact, and goes on.
        producer.publish("topic", b"parent-after")
        assert producer.stats.published == 2
    wait_until_blocking(lambda: stats(daemon, "topic").get("message_count") == 3)


def test_after_fork_error_fails_with_a_clear_message(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address], after_fork="error") as producer:
        producer.publish("topic", b"x")

        def child() -> str:
            producer.publish("topic", b"never")
            return "published"

        report = in_child(child)
        assert report.startswith("ForkedError: this Producer was started in process")
        producer.publish("topic", b"y")


def test_a_consumer_started_before_fork_fails_in_the_child(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.publish("topic", b"x")
    with blocking.Consumer("topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address]) as consumer:
        message = next(iter(consumer))

        def child() -> str:
            message.finish()  # not this process's to settle: ignored
            next(iter(consumer))
            return "iterated"

        report = in_child(child)
        assert report.startswith("ForkedError: this Consumer was started before a fork()")
        message.finish()
    wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("depth") == 0)
    assert stats(daemon, "topic", "chan")["in_flight_count"] == 0


def test_a_producer_created_but_not_started_before_fork_just_works(daemon: BlockingNode) -> None:
    producer = blocking.Producer([daemon.tcp_address])

    def child() -> str:
        with producer:
            producer.publish("topic", b"from the child")
        return "ok"

    assert in_child(child) == "ok"
    wait_until_blocking(lambda: stats(daemon, "topic").get("message_count") == 1)


def test_asyncio_clients_in_guest_mode_fail_in_the_child(daemon: BlockingNode) -> None:
    async def main() -> str:
        async with (
            aio.Producer([daemon.tcp_address]) as producer,
            # (a topic with nothing to hand out: a message ready is handed out at once)
            aio.Consumer("empty", "chan", nsqd_tcp_addresses=[daemon.tcp_address]) as consumer,
        ):
            await producer.publish("topic", b"parent-before")

            def child() -> str:
                # The calls driven by hand: the child has no loop running (it
                # is a copy of one in the middle of a step).  A publish raises
                # at the call; the consumer's coroutine at its first step.
                reports = []
                try:
                    producer.publish("topic", b"never")
                except aio.ForkedError as exc:
                    reports.append(f"ForkedError: {exc}")
                step = consumer.__anext__()
                try:
                    step.send(None)
                except aio.ForkedError as exc:
                    reports.append(f"ForkedError: {exc}")
                finally:
                    step.close()
                return "\n".join(reports)

            report = in_child(child)
            await producer.publish("topic", b"parent-after")  # the parent goes on
            return report

    report = asyncio.run(main())
    assert report.splitlines() == [
        "ForkedError: this Producer was opened before a fork(); open one in this process",
        "ForkedError: this Consumer was opened before a fork()",
    ]
    wait_until_blocking(lambda: stats(daemon, "topic").get("message_count") == 2)
