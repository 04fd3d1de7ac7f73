"""trionsq: an NSQ client built on Trio's structured concurrency."""

from .backoff import Backoff, BackoffState
from .config import BackoffPolicy, Config
from .connection import (
    Connection,
    ConnectionClosedError,
    NegotiationError,
    NSQConnectionError,
)
from .consumer import ConnectionStats, Consumer, ConsumerStats
from .http import http_multi_publish, http_publish
from .message import Message
from .producer import Producer, ProducerStats
from .protocol.errors import *  # noqa: F403
from .protocol.errors import __all__ as _errors_all
from .transport import Connector, tcp_connector

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Backoff",
    "BackoffPolicy",
    "BackoffState",
    "Config",
    "Connection",
    "ConnectionClosedError",
    "ConnectionStats",
    "Connector",
    "Consumer",
    "ConsumerStats",
    "Message",
    "NSQConnectionError",
    "NegotiationError",
    "Producer",
    "ProducerStats",
    "http_multi_publish",
    "http_publish",
    "tcp_connector",
    *_errors_all,
]
