"""Normalizing an outcome so that fakensq's and nsqd's can be compared.

What legitimately differs between two runs (message ids, ports, the client's own
addresses, the hostname, times) is replaced by placeholders; everything else is
kept exactly.  Each target has its own :class:`Normalizer`; sessions register
what they learn (message ids, local addresses) as they read.

- exact values: :meth:`Normalizer.alias` maps a string (or an int) to a
  placeholder, wherever it occurs whole, and inside longer strings for strings
  (an address in an error text, an id in ``E_FIN_FAILED FIN <id> failed ...``);
- keys: :attr:`Normalizer.key_rules` maps a JSON key to a function of its value
  (``start_time`` becomes ``"<time>"``); add rules for a scenario with
  ``Normalizer.key_rules[key] = ...`` or pass ``normalize=`` to the comparison;
- message ids: :meth:`Normalizer.message_id` aliases ids ``<ID1>``, ``<ID2>``...
  in the order they were first seen.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

__all__ = ["Normalizer", "TIME", "key_order"]

TIME = "<time>"


def _time(value: Any) -> Any:
    # A time that varies run to run: only its presence and type matter.
    return TIME if isinstance(value, int | float) and not isinstance(value, bool) else value


def _by_topic(value: Any) -> Any:
    # nsqd builds this list by ranging over a Go map: its order varies run to
    # run (the real nsqd showed a client's two topics either way round).
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return sorted(value, key=lambda v: str(v.get("topic")))
    return value


#: Keys whose values vary between runs: times (or durations), and lists nsqd
#: makes from a Go map (in no fixed order).
DEFAULT_KEY_RULES: dict[str, Callable[[Any], Any]] = {
    "start_time": _time,
    "connect_ts": _time,
    "pub_counts": _by_topic,
}


class Normalizer:
    """Placeholders for one target's varying values (see the module doc)."""

    def __init__(self) -> None:
        self._strings: dict[str, str] = {}
        self._ints: dict[int, str] = {}
        self._ids: dict[bytes, str] = {}
        self.key_rules: dict[str, Callable[[Any], Any]] = dict(DEFAULT_KEY_RULES)
        self.alias(socket.gethostname(), "<hostname>", within=False)

    def alias(self, raw: str | int, placeholder: str, *, within: bool = True) -> None:
        """Replace ``raw`` by ``placeholder``: whole values, and (``within``) for
        strings also where they occur inside a longer string."""
        if isinstance(raw, int):
            self._ints[raw] = placeholder
            return
        if not raw:
            return
        if within:
            self._strings[raw] = placeholder
        else:
            self._strings.setdefault("\0whole\0" + raw, placeholder)

    def message_id(self, raw: bytes, scope: bytes = b"") -> str:
        """The placeholder of a message id (a new one for an id not seen yet).

        ``scope`` (a topic name) keeps ids of different topics apart: nsqd's ids
        are unique within a topic only (each topic has its own id factory, of
        the time in milliseconds and a sequence), so two topics publishing in
        the same millisecond may hand out the same id.
        """
        key = scope + b"\0" + raw if scope else raw
        alias = self._ids.get(key)
        if alias is None:
            alias = self._ids[key] = f"<ID{len(self._ids) + 1}>"
            self._strings.setdefault(raw.decode("latin-1"), alias)
        return alias

    def __call__(self, value: Any) -> Any:
        """``value`` with every varying part replaced (a new object)."""
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                rule = self.key_rules.get(key) if isinstance(key, str) else None
                item = self(item)
                out[self(key)] = rule(item) if rule is not None else item
            return out
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self(v) for v in value)
        if isinstance(value, str):
            return self._string(value)
        if isinstance(value, bytes):
            return self._bytes(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return self._ints.get(value, value)
        return value

    def _string(self, text: str) -> str:
        whole = self._strings.get("\0whole\0" + text)
        if whole is not None:
            return whole
        # Longest first, so an address is replaced before a port inside it.
        for raw in sorted(self._strings, key=len, reverse=True):
            if raw.startswith("\0whole\0"):
                continue
            if raw in text:
                text = text.replace(raw, self._strings[raw])
        return text

    def _bytes(self, data: bytes) -> bytes:
        for raw in sorted(self._strings, key=len, reverse=True):
            if raw.startswith("\0whole\0"):
                continue
            encoded = raw.encode("latin-1", "replace")
            if encoded in data:
                data = data.replace(encoded, self._strings[raw].encode())
        return data


def type_only(value: Any) -> Any:
    """A value's type in place of the value (what may differ between runs and
    between the daemons, as memory figures, whose kind must not)."""
    return f"<{type(value).__name__}>"


def key_order(value: Any) -> Any:
    """The order of keys of every dict inside ``value`` (JSON key order is part of
    what a client sees: Go writes struct fields in a fixed order)."""
    if isinstance(value, dict):
        return [(k, key_order(v)) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [key_order(v) for v in value]
    return None
