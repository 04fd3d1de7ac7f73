"""A consumer's nsqds found through nsqlookupd: polled, connected, dropped.

:class:`Discovery` (which :class:`~trionsq.consumer.Consumer` inherits) polls
every lookupd each ``lookupd_poll_interval`` (with jitter), connects to the
nsqds that have the topic as soon as one lookupd names them, and disconnects
from one only when every lookupd answered and none has it any more.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from .config import Config
from .lifecycle import OPEN, Life, Lifecycle
from .lookupd import lookup, merge
from .session import Session

if TYPE_CHECKING:
    import httpx

__all__ = ["Discovery"]

log = logging.getLogger("trionsq.consumer")


class Discovery:
    """The discovery steps, for :class:`~trionsq.consumer.Consumer` (which
    inherits them, and sets these attributes up)."""

    topic: str
    config: Config
    _rng: random.Random
    _life: Lifecycle[Life]
    _nursery: trio.Nursery | None
    _discovered: dict[str, trio.CancelScope]
    _serving: dict[Session, None]
    _connect_and_serve: Callable[[str], Awaitable[bool]]

    @trio.lowlevel.enable_ki_protection
    async def _discovery(self) -> None:
        config = self.config
        # Imported here: a consumer given only nsqd addresses never pays for httpx.
        import httpx

        async with httpx.AsyncClient(
            transport=config.http_transport,
            timeout=httpx.Timeout(min(config.lookupd_poll_interval, 10.0)),
        ) as client:
            while self._life.state is OPEN:
                await self._poll_lookupds(client)
                jitter = config.lookupd_poll_jitter
                factor = 1 + jitter * (self._rng.random() - 0.5)
                await trio.sleep(config.lookupd_poll_interval * factor)

    async def _poll_lookupds(self, client: httpx.AsyncClient) -> None:
        import httpx

        addresses = self.config.lookupd_http_addresses
        answers: list[set[str] | None] = [None] * len(addresses)
        timeout = min(self.config.lookupd_poll_interval, 10.0)

        async def ask(index: int) -> None:
            with trio.move_on_after(timeout):
                try:
                    answers[index] = await lookup(client, addresses[index], self.topic)
                except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
                    log.warning("lookupd %s: %s", addresses[index], exc)
            found = answers[index]
            if found is not None:
                # Connect at once: a slow lookupd must not hold back the others.
                self._connect_discovered(found)

        async with trio.open_nursery() as nursery:
            for index in range(len(addresses)):
                nursery.start_soon(ask, index)
        if all(answer is not None for answer in answers):
            # Only when every lookupd answered is absence meaningful.
            found = merge(answers)
            for address in set(self._discovered) - found:
                log.info("%s no longer has %s: disconnecting", address, self.topic)
                self._discovered.pop(address).cancel()
                for session in self._serving:
                    if session.address == address:
                        session.scope.cancel()  # its connection is shielded

    def _connect_discovered(self, found: set[str]) -> None:
        assert self._nursery is not None
        static = set(self.config.nsqd_tcp_addresses)
        for address in sorted(found - static - set(self._discovered)):
            if self._life.state is not OPEN:
                return
            scope = trio.CancelScope()
            self._discovered[address] = scope
            self._nursery.start_soon(self._discovered_connection, address, scope)

    @trio.lowlevel.enable_ki_protection
    async def _discovered_connection(self, address: str, scope: trio.CancelScope) -> None:
        """One attempt; the next lookupd poll reconnects (per the client guide)."""
        with scope:
            await self._connect_and_serve(address)
        if self._discovered.get(address) is scope:
            del self._discovered[address]
