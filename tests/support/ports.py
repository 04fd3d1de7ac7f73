"""Loopback ports for tests: one free to listen on, one where nothing listens.

Everything listens on 127.0.0.1 only.  A port "free" now was bound and
released: another process may take it before the caller binds it (a tiny
race, which :class:`fakensq.testing.real.RealProcess` answers by starting on
fresh ports).  An address that must refuse connections is held instead:
bound, never listening, for as long as the caller needs it.  :func:`free_port`
is the one the real daemons' runner picks its ports with.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from fakensq.testing.real import free_port

__all__ = ["free_address", "free_port", "refused_address"]


def free_address() -> str:
    """``127.0.0.1:PORT`` with a port free right now (see :func:`free_port`)."""
    return f"127.0.0.1:{free_port()}"


@contextmanager
def refused_address() -> Iterator[str]:
    """``127.0.0.1:PORT`` that refuses connections for as long as it is held
    (bound, never listening: no other test can start listening there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"
