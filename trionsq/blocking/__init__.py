"""trionsq for synchronous programs: a blocking Producer and Consumer.

Each client runs the Trio core (:class:`trionsq.Producer`, :class:`trionsq.Consumer`)
in a Trio loop on a thread of its own, so every option and guarantee of the async
clients holds; this package is the thread-safe, blocking way in.
"""

from ..hosting.producer import ClientClosedError
from ..hosting.trio_thread import BlockingInTrioError, ForkedError
from .consumer import Consumer, GiveUp, Handler, Message
from .producer import Producer

__all__ = [
    "BlockingInTrioError",
    "ClientClosedError",
    "Consumer",
    "ForkedError",
    "GiveUp",
    "Handler",
    "Message",
    "Producer",
]
