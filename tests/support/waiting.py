"""Waiting, always bounded, for a condition that something else makes true.

The suite never sleeps a fixed time to let something happen: where there is no
event to wait on (a condition spread over a client and a server, another
process's state, a counter), it polls the condition under a deadline.  These
are the only polling loops of the suite, one for each way a test runs:

- :func:`wait_until`: Trio code, a synchronous condition (a list the handler
  fills, a client's stats); in virtual time too (``autojump_clock``).
- :func:`poll_until` and :func:`poll`: Trio code, a value that must be read
  asynchronously (an HTTP ``/stats``, nsqlookupd's ``/lookup``): ``poll_until``
  fails with the last value read, ``poll`` returns it for the caller to judge.
- :func:`wait_until_blocking`: blocking code (threads, the front ends'
  blocking API, subprocess tools, Spark).
- :func:`wait_until_asyncio`: asyncio code (the asyncio front end).

Each fails with an ``AssertionError`` that says what it waited for (``what``,
else the condition's own source line and where it is) and for how long.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import trio

__all__ = ["poll", "poll_until", "wait_until", "wait_until_asyncio", "wait_until_blocking"]

T = TypeVar("T")

#: The default bound: generous, for a loaded machine (nothing here waits on time).
LIMIT = 30.0
#: Between two reads of another process's state (nsqd answers /stats in ~1 ms).
POLL_STEP = 0.01


def describe(condition: Callable[..., object]) -> str:
    """What ``condition`` checks, for a failure message: its source (a
    lambda's line), and the file and line it is written on."""
    code = getattr(condition, "__code__", None)
    if code is None:
        return repr(condition)
    try:
        source = " ".join(inspect.getsource(condition).split())
    except (OSError, TypeError):
        source = getattr(condition, "__qualname__", repr(condition))
    if len(source) > 200:
        source = source[:197] + "..."
    return f"{source} ({Path(code.co_filename).name}:{code.co_firstlineno})"


def _failure(limit: float, what: str, condition: Callable[..., object]) -> AssertionError:
    return AssertionError(f"waited {limit} s for {what or describe(condition)}")


async def wait_until(
    condition: Callable[[], T], *, limit: float = LIMIT, step: float = 0.001, what: str = ""
) -> T:
    """Poll ``condition()`` every ``step`` seconds until it is true; returns
    its value.  Fails after ``limit`` seconds (virtual ones under a MockClock)."""
    with trio.move_on_after(limit):
        while not (value := condition()):  # noqa: ASYNC110 - no event to wait on (module doc)
            await trio.sleep(step)
        return value
    raise _failure(limit, what, condition)


async def poll(
    read: Callable[[], Awaitable[T]],
    done: Callable[[T], object],
    *,
    limit: float = LIMIT,
    step: float = POLL_STEP,
) -> T:
    """``await read()`` until ``done(value)``, for at most ``limit`` seconds;
    the last value read, done or not (the caller says what is wrong)."""
    value = await read()
    with trio.move_on_after(limit):
        while not done(value):
            await trio.sleep(step)
            value = await read()
    return value


async def poll_until(
    read: Callable[[], Awaitable[T]],
    done: Callable[[T], object] = bool,
    what: str = "",
    *,
    limit: float = LIMIT,
    step: float = POLL_STEP,
) -> T:
    """``await read()`` until ``done(value)``, then return that value.

    Fails after ``limit`` seconds, naming ``what`` (the condition waited for,
    in words; else ``read``'s source) and the value last read."""
    last: object = "nothing (no read finished)"
    with trio.move_on_after(limit):
        while True:
            value = await read()
            if done(value):
                return value
            last = value
            await trio.sleep(step)
    raise AssertionError(f"{_failure(limit, what, read)}; last read: {last!r}")


def wait_until_blocking(
    condition: Callable[[], T], *, limit: float = LIMIT, step: float = 0.05, what: str = ""
) -> T:
    """:func:`wait_until` for blocking code: polls ``condition()`` with
    ``time.sleep`` in between; returns its (true) value.  Its conditions are
    mostly reads of another process's state (an HTTP client each, in blocking
    code), hence the longer step."""
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _failure(limit, what, condition)
        time.sleep(step)


async def wait_until_asyncio(
    condition: Callable[[], T], *, limit: float = LIMIT, step: float = 0.005, what: str = ""
) -> T:
    """:func:`wait_until` for asyncio code."""
    deadline = asyncio.get_running_loop().time() + limit
    while not (value := condition()):
        if asyncio.get_running_loop().time() > deadline:
            raise _failure(limit, what, condition)
        await asyncio.sleep(step)
    return value
