"""nsqlookupd's registration database: which nsqd (peer) produces which topic
and channel, when it last pinged, and tombstones (``nsqlookupd/registration_db.go``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from trionsq.protocol.peers import Peer

__all__ = [
    "PeerInfo",
    "Producer",
    "Registration",
    "RegistrationDB",
    "filter_by_active",
]


@dataclass
class PeerInfo(Peer):
    """An nsqd as it IDENTIFYed itself; ``id`` is its connection's remote address."""

    id: str
    last_update: float = 0.0  # trio.current_time() of IDENTIFY or the last PING

    def to_json(self) -> dict[str, Any]:
        return self.peer_json()


@dataclass(eq=False)
class Producer:
    """A peer's entry under one registration, with that registration's tombstone."""

    peer: PeerInfo
    tombstoned: bool = False
    tombstoned_at: float = 0.0

    def tombstone(self) -> None:
        self.tombstoned = True
        self.tombstoned_at = trio.current_time()

    def is_tombstoned(self, lifetime: float) -> bool:
        return self.tombstoned and trio.current_time() - self.tombstoned_at < lifetime


@dataclass(frozen=True)
class Registration:
    """``(category, key, subkey)``: ``client``, ``topic`` (key=topic) or ``channel``."""

    category: str
    key: str
    subkey: str = ""

    def matches(self, category: str, key: str, subkey: str) -> bool:
        if self.category != category:
            return False
        if key != "*" and self.key != key:
            return False
        return subkey == "*" or self.subkey == subkey


class RegistrationDB:
    """nsqlookupd's registration map: registration → producers by peer id.

    Insertion-ordered (Go's map order is random; any order is faithful, a stable
    one makes tests repeatable).  ``changed`` is set after each change, then
    replaced, so tasks can wait for the DB to move.
    """

    def __init__(self) -> None:
        self._map: dict[Registration, dict[str, Producer]] = {}
        self._changed = trio.Event()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Return at the next change of the DB."""
        await self._changed.wait()

    def add_registration(self, key: Registration) -> None:
        if key not in self._map:
            self._map[key] = {}
            self._touch()

    def add_producer(self, key: Registration, producer: Producer) -> bool:
        """Add ``producer`` under ``key``; False when its peer was already there."""
        producers = self._map.setdefault(key, {})
        if producer.peer.id in producers:
            self._touch()  # the registration itself may be new
            return False
        producers[producer.peer.id] = producer
        self._touch()
        return True

    def remove_producer(self, key: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove a peer from ``key``: (whether it was there, how many are left)."""
        producers = self._map.get(key)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._touch()
        return removed, len(producers)

    def remove_registration(self, key: Registration) -> None:
        if self._map.pop(key, None) is not None:
            self._touch()

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        if "*" not in (key, subkey):
            reg = Registration(category, key, subkey)
            return [reg] if reg in self._map else []
        return [r for r in self._map if r.matches(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        if "*" not in (key, subkey):
            return list(self._map.get(Registration(category, key, subkey), {}).values())
        seen: dict[str, Producer] = {}
        for reg, producers in self._map.items():
            if reg.matches(category, key, subkey):
                for peer_id, producer in producers.items():
                    seen.setdefault(peer_id, producer)
        return list(seen.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        return [reg for reg, producers in self._map.items() if peer_id in producers]

    def has_producers(self) -> bool:
        """True while any registration has a producer."""
        return any(self._map.values())

    def items(self) -> list[tuple[Registration, list[Producer]]]:
        return [(reg, list(producers.values())) for reg, producers in self._map.items()]


def filter_by_active(
    producers: list[Producer], inactivity_timeout: float, tombstone_lifetime: float
) -> list[Producer]:
    """Producers pinged within ``inactivity_timeout`` and not tombstoned."""
    now = trio.current_time()
    return [
        p
        for p in producers
        if not (
            now - p.peer.last_update > inactivity_timeout or p.is_tombstoned(tombstone_lifetime)
        )
    ]
