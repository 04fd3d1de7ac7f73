"""Waiting, bounded, for state another process changes on its own.

nsqd changes some of its state a moment after the request that caused it
answered (a topic's pump moving messages to its channels, a client's removal
after its socket closed, an ephemeral channel's deletion after its last client
left).  A scenario compares that state at rest, so it reads it again until a
condition holds: :func:`poll_until`, always bounded, and failing with what it
waited for and what it last read, not with a bare timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from .session import READ_TIMEOUT

__all__ = ["poll_until"]

T = TypeVar("T")

#: between two reads of another process's state (nsqd answers /stats in ~1 ms)
POLL_INTERVAL = 0.01


async def poll_until(
    read: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    what: str,
) -> T:
    """``await read()`` until ``done(value)``, then return that value.

    Raises ``AssertionError`` after ``READ_TIMEOUT`` seconds, naming ``what`` (the
    condition waited for, in words) and the value last read.
    """
    last: object = "nothing (no read finished)"
    with trio.move_on_after(READ_TIMEOUT):
        while True:
            value = await read()
            if done(value):
                return value
            last = value
            await trio.sleep(POLL_INTERVAL)  # another process's state: poll it
    raise AssertionError(f"waited {READ_TIMEOUT} s for {what}; last read: {last!r}")
