"""What a topic, a channel and a client connection ask of the nsqd that owns
them: small protocols :class:`~fakensq.nsqd.node.NSQD` satisfies, so that the
inner objects never import the node (and can be built around a stand-in)."""

from __future__ import annotations

import random
import ssl
from typing import TYPE_CHECKING, Literal, Protocol

from .auth import AuthHandler
from .hooks import NodeHooks
from .message import GUIDFactory, MessageQueue
from .options import NSQDOptions

if TYPE_CHECKING:
    from .channel import Channel
    from .client import ClientConnection
    from .topic import Topic

__all__ = ["ChannelOwner", "ClientOwner", "TopicOwner"]


class ChannelOwner(Protocol):
    """What a channel asks of its node: options, queues, the queue scan's clock."""

    @property
    def options(self) -> NSQDOptions: ...

    @property
    def rng(self) -> random.Random:
        """The seeded choice of a ready client for each message."""
        ...

    @property
    def requeue_on_disconnect(self) -> bool: ...

    def new_queue(self, topic: str, channel: str | None) -> MessageQueue:
        """A queue for a topic (``channel`` None) or a channel: memory or disk."""
        ...

    def scan_known_from(self) -> float:
        """The time from which the queue scan knows about a new channel."""
        ...

    def scan_time(self, deadline: float, known_from: float) -> float:
        """When nsqd's queue scan acts on ``deadline``."""
        ...


class TopicOwner(ChannelOwner, Protocol):
    """What a topic asks of its node, besides what its channels ask."""

    @property
    def guids(self) -> GUIDFactory: ...

    @property
    def hooks(self) -> NodeHooks | None: ...

    def start_channel(self, channel: Channel) -> None:
        """Run a new channel's timers in the node's task tree."""
        ...

    def notify_registry(
        self, action: Literal["register", "unregister"], topic: str, channel: str | None
    ) -> None:
        """Tell the registry listeners (nsqlookupd registration) of a change."""
        ...

    def delete_topic(self, name: str) -> bool: ...


class ClientOwner(Protocol):
    """What a client connection asks of its node."""

    @property
    def options(self) -> NSQDOptions: ...

    @property
    def rng(self) -> random.Random: ...

    @property
    def clients(self) -> dict[int, ClientConnection]: ...

    @property
    def tls_context(self) -> ssl.SSLContext | None: ...

    @property
    def auth_handler(self) -> AuthHandler | None: ...

    @property
    def auth_enabled(self) -> bool: ...

    def get_topic(self, name: str) -> Topic: ...

    @property
    def topics(self) -> dict[str, Topic]:
        """The topics by name (a client publishes to an existing one at once)."""

    async def open_topic(self, name: str) -> Topic: ...
