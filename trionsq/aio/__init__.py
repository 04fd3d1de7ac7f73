"""trionsq for asyncio programs: ``async with`` / ``async for`` clients.

Each client runs the Trio core (:class:`trionsq.Producer`, :class:`trionsq.Consumer`)
in Trio's guest mode on the asyncio loop (:mod:`trionsq.aio.guest`): one Trio run
per asyncio loop, on the loop's own thread, shared by the clients entered on it,
started by the first ``async with`` and ended by the last.  Messages and answers
cross between Trio and asyncio code by plain calls, never by a thread switch.
``guest=False`` runs a client's Trio loop on a thread of its own instead (results
come back through ``call_soon_threadsafe``, in batches).  The Producer needs no
Trio by default: the asyncio loop publishes itself (:mod:`trionsq.aio.direct`).
Named ``aio`` (as in ``grpc.aio``) so that it never shadows the standard
library's ``asyncio``.
"""

from ..hosting.producer import ClientClosedError
from ..hosting.trio_thread import ForkedError
from .consumer import Consumer, GiveUp, Handler, Message
from .guest import GuestUnavailableError
from .producer import Producer, PublishFuture

__all__ = [
    "ClientClosedError",
    "Consumer",
    "ForkedError",
    "GiveUp",
    "GuestUnavailableError",
    "Handler",
    "Message",
    "Producer",
    "PublishFuture",
]
