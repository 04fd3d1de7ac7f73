"""Serving peers that may lie: one peer's failure ends its connection, nothing else.

Every listening socket of the source (an agent's task socket and peer port, the
coordinator) serves its connections through :func:`serve`: whatever a handler
raises (a framing error, a bad value, ``MemoryError``) is logged and ends that
connection only, never the server's nursery.  A peer that has not proven itself
yet (no TLS handshake, no token, no first frame) is *unproven*: a :class:`Gate`
bounds how many may wait at once and how long each may take, so slow and
half-open connections hold little, and not for long.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import trio

__all__ = ["Gate", "bind_unix", "same_user", "serve"]

log = logging.getLogger("trionsq.spark")


class Gate:
    """At most ``limit`` unproven peers at once, each proving itself within ``deadline``.

    A newcomer beyond ``limit`` evicts the peer that has waited longest, rather
    than being turned away: slow or half-open connections can neither hold
    resources for long nor lock a real peer out (it proves itself in
    milliseconds).
    """

    def __init__(self, limit: int, deadline: float) -> None:
        self.limit = limit
        self.deadline = deadline
        self._waiting: deque[trio.CancelScope] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @contextmanager
    def unproven(self) -> Iterator[None]:
        """Around the handshake and first frame of a connection: raises
        :class:`trio.TooSlowError` after ``deadline``, or once evicted."""
        while len(self._waiting) >= self.limit:
            self._waiting.popleft().cancel()
        scope = trio.CancelScope(deadline=trio.current_time() + self.deadline)
        self._waiting.append(scope)
        try:
            with scope:
                yield
        finally:
            if scope in self._waiting:
                self._waiting.remove(scope)
        if scope.cancelled_caught:
            raise trio.TooSlowError("the peer did not prove itself in time (or was evicted)")


async def serve(
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    listeners: list[trio.SocketListener],
    what: str,
) -> None:
    """:func:`trio.serve_listeners`, with each connection's failures kept to itself."""

    async def guarded(stream: trio.SocketStream) -> None:
        try:
            await handler(stream)
        except Exception as exc:  # MemoryError too: the peer goes, the server stays
            if isinstance(exc, (OSError, EOFError, trio.TooSlowError, trio.BrokenResourceError)):
                log.info("%s: a peer's connection ended: %r", what, exc)
            else:
                log.warning("%s: a peer's connection failed: %r", what, exc)
        finally:
            await trio.aclose_forcefully(stream)

    await trio.serve_listeners(guarded, listeners)


def same_user(sock: trio.socket.SocketType) -> bool:
    """Whether the peer of a Unix socket runs as this user (Linux's SO_PEERCRED;
    elsewhere the socket's folder, mode 0700, is the only guard)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return True
    try:
        credentials = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    except OSError:
        return True
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return bool(uid == os.getuid())


def bind_unix(path: str) -> socket.socket:
    """Bind the task socket; a stale file (its agent died) is replaced, a live agent wins."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody answers: a dead agent's file
            sock.bind(path)
        else:
            probe.close()
            sock.close()
            raise SystemExit(0) from None  # another agent serves this executor
    os.chmod(path, 0o600)
    sock.listen(256)
    return sock
