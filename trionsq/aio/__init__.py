"""trionsq for asyncio programs: ``async with`` / ``async for`` clients.

Each client runs the Trio core (:class:`trionsq.Producer`, :class:`trionsq.Consumer`)
in a Trio loop on a thread of its own, started when the ``async with`` is entered
and joined before it is left; results come back to the asyncio loop through
``call_soon_threadsafe``, in batches.  Named ``aio`` (as in ``grpc.aio``) so that
it never shadows the standard library's ``asyncio``.
"""

from ..hosted import ClientClosedError
from ..trio_thread import ForkedError
from .consumer import Consumer, GiveUp, Handler, Message
from .producer import Producer

__all__ = [
    "ClientClosedError",
    "Consumer",
    "ForkedError",
    "GiveUp",
    "Handler",
    "Message",
    "Producer",
]
