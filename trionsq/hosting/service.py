"""What a hosted client (:class:`~trionsq.hosting.producer.HostedProducer`,
:class:`~trionsq.hosting.consumer.HostedConsumer`) is besides its work: one
service task in a :class:`~trionsq.hosting.trio_thread.TrioThread`, started
blocking or not, asked to end from the loop, its sockets tracked for ``fork()``.

Each subclass writes :meth:`HostedService._serve` (its client's life in the
loop); how that task is started and ended is written once, here.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import trio

from ..config import Config
from ..transport import Connector
from .trio_thread import TrioThread

__all__ = ["HostedService", "tracking_connector"]


def tracking_connector(connector: Connector, runner: TrioThread) -> Connector:
    """``connector``, with every TCP socket it opens registered with ``runner``
    (so that a forked child closes its copy and never talks on it)."""

    async def connect(host: str, port: int) -> trio.abc.Stream:
        stream = await connector(host, port)
        if isinstance(stream, trio.SocketStream):
            runner.track_socket(stream.socket)
        return stream

    return connect


class HostedService(abc.ABC):
    """A client served by one task, :meth:`_serve`, in :attr:`runner`'s loop.

    ``runner`` is where the loop runs (default: a thread of its own, named
    ``name``; the asyncio front end passes a guest run of its loop's);
    :attr:`config` is the client's, its connector tracking sockets there.
    :meth:`_serve` makes :attr:`_close_requested` and :attr:`_served` when it
    starts, waits on the first and sets the second when it ends.
    """

    def __init__(self, config: Config, name: str, runner: TrioThread | None) -> None:
        self.runner = TrioThread(name) if runner is None else runner
        self.config = config.replace(connector=tracking_connector(config.connector, self.runner))
        self._close_requested: trio.Event | None = None
        self._served: trio.Event | None = None

    @abc.abstractmethod
    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The service, in the loop: reports started once its client runs."""

    # --- life (from the front end's thread) ---

    def start(self) -> None:
        """Start the thread and the service; blocks until its client runs."""
        self.runner.start()
        try:
            self.runner.start_service(self._serve)
        except BaseException:
            self.runner.close()
            raise

    def launch(
        self,
        on_started: Callable[[BaseException | None], None],
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """Start without blocking; ``on_started(error)`` is called from the loop's
        thread once the client runs (``None``) or failed to start, and
        ``on_exit()`` once the loop has ended."""
        self.runner.launch_service(self._serve, on_started, on_exit)

    async def aclose(self) -> None:
        """In the loop: ask the service to end and wait until it has."""
        if self._close_requested is not None and self._served is not None:
            self._close_requested.set()
            await self._served.wait()
