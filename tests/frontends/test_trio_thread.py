"""trionsq.hosting.trio_thread.TrioThread: one Trio run on a thread, called from others."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import trio
import trio.lowlevel

from trionsq.hosting.trio_thread import (
    BlockingInTrioError,
    ForkedError,
    LoopStoppedError,
    TrioThread,
    check_not_in_trio,
)


@pytest.fixture
def runner() -> Iterator[TrioThread]:
    runner = TrioThread("test-runner")
    runner.start()
    try:
        yield runner
    finally:
        assert runner.close(10)


def test_run_returns_results_and_carries_exceptions_back(runner: TrioThread) -> None:
    async def add(a: int, b: int) -> int:
        await trio.lowlevel.checkpoint()
        return a + b

    async def fail() -> None:
        raise KeyError("nope")

    assert runner.run(add, 2, 3) == 5
    with pytest.raises(KeyError, match="nope"):
        runner.run(fail)
    assert runner.run_sync(lambda: threading.current_thread().name) == "test-runner"
    assert runner.alive and not runner.in_loop_thread


def test_a_timeout_cancels_the_call_in_the_loop(runner: TrioThread) -> None:
    seen: list[str] = []

    async def slow() -> None:
        try:
            await trio.sleep_forever()
        finally:
            seen.append("cancelled")

    with pytest.raises(TimeoutError):
        runner.run(slow, timeout=0.05)
    # The call was cancelled (and had unwound) before run() raised.
    assert seen == ["cancelled"]
    assert runner.run(trio.sleep, 0) is None  # the loop goes on


def test_ctrl_c_while_waiting_cancels_the_call(runner: TrioThread) -> None:
    seen: list[str] = []
    started = threading.Event()

    async def slow() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            seen.append("cancelled")

    def interrupt() -> None:
        started.wait(10)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    # Python leaves SIGINT ignored when it inherits it so (a suite started in
    # the background by a shell without job control), and a handler another
    # test left would take it: the signal must raise here, or the call would
    # wait for ever (bounded by the timeout: a failure, never a hang).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    helper = threading.Thread(target=interrupt)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run(slow, timeout=60)
    finally:
        helper.join()
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        runner.run(trio.sleep, 0.01)
    assert seen == ["cancelled"]


async def test_a_blocking_call_from_a_trio_task_raises_at_once() -> None:
    runner = TrioThread("from-trio")
    with pytest.raises(BlockingInTrioError, match="inside a Trio run"):
        runner.start()
    with pytest.raises(BlockingInTrioError):
        check_not_in_trio()


def test_a_call_from_the_loop_itself_raises_instead_of_deadlocking(runner: TrioThread) -> None:
    async def nested() -> None:
        runner.run(trio.sleep, 0)

    with pytest.raises(BlockingInTrioError):
        runner.run(nested)


def test_calls_after_close_raise_and_never_hang() -> None:
    runner = TrioThread("closing")
    runner.start()
    assert runner.close(10)
    assert not runner.alive
    with pytest.raises(LoopStoppedError):
        runner.run(trio.sleep, 0)
    with pytest.raises(LoopStoppedError):
        runner.run_sync(int)
    assert runner.close(10)  # twice is fine
    assert "closing" not in [t.name for t in threading.enumerate()]


def test_a_call_running_when_the_loop_closes_gets_loop_stopped() -> None:
    runner = TrioThread("closing-under-a-call")
    runner.start()
    result: list[BaseException] = []

    def caller() -> None:
        try:
            runner.run(trio.sleep_forever)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    time.sleep(0.05)  # let the call start; the assertion holds either way
    runner.close(10)
    thread.join(10)
    assert len(result) == 1 and isinstance(result[0], LoopStoppedError)


def test_services_start_and_report_what_they_started(runner: TrioThread) -> None:
    async def service(value: int, *, task_status: trio.TaskStatus[int]) -> None:
        task_status.started(value * 2)
        await trio.sleep_forever()

    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        raise OSError("address in use")

    assert runner.start_service(service, 21) == 42
    with pytest.raises(OSError, match="address in use"):
        runner.start_service(broken)


def test_submit_calls_back_in_the_loop_and_can_be_cancelled(runner: TrioThread) -> None:
    results: list[object] = []
    done = threading.Event()

    def record(result: object) -> None:
        results.append(result)
        done.set()

    async def value() -> int:
        return 7

    runner.submit(value, done=record)
    assert done.wait(10)
    assert results[0].unwrap() == 7  # type: ignore[attr-defined]
    done.clear()
    cancel = runner.submit(trio.sleep_forever, done=record)
    cancel()
    assert done.wait(10)
    with pytest.raises(LoopStoppedError):
        results[1].unwrap()  # type: ignore[attr-defined]


def test_run_in_thread_runs_blocking_code_off_the_loop(runner: TrioThread) -> None:
    async def main() -> str:
        return await runner.run_in_thread(lambda: threading.current_thread().name)

    name = runner.run(main)
    assert name == "test-runner-helper"
    assert name not in [t.name for t in threading.enumerate()]


def test_a_crashed_service_stops_the_loop_and_says_why() -> None:
    runner = TrioThread("crashing")
    runner.start()

    async def crash(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        raise ValueError("boom")

    runner.start_service(crash)
    assert runner.join(10)
    with pytest.raises(LoopStoppedError) as info:
        runner.run(trio.sleep, 0)
    assert info.value.__cause__ is runner.error
    assert runner.close(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_sees_a_dead_runner_and_closes_its_socket_copies() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    runner = TrioThread("before-fork")
    runner.start()
    forked: list[str] = []
    runner.on_fork(lambda: forked.append("child"))
    try:

        async def connect() -> trio.SocketStream:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            runner.track_socket(stream.socket)
            return stream

        stream = runner.run(connect)
        server_side, _ = listener.accept()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without any cleanup
            try:
                report = [str(runner.forked), str(stream.socket.fileno()), ",".join(forked)]
                try:
                    runner.run(trio.sleep, 0)
                except ForkedError as exc:
                    report.append("ForkedError" if "fork" in str(exc) else str(exc))
                report.append(str(runner.close(1)))
                os.write(write, "|".join(report).encode())
            finally:
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            report = pipe.read().split("|")
        assert os.waitstatus_to_exitcode(status) == 0
        # In the child: forked, the socket's copy closed, the callback run, calls refused.
        assert report == ["True", "-1", "child", "ForkedError", "True"]
        # The parent's connection is untouched.
        assert not runner.forked

        async def send() -> None:
            await stream.send_all(b"still here")

        runner.run(send)
        assert server_side.recv(100) == b"still here"
        server_side.close()
    finally:
        runner.close(10)
        listener.close()
