"""The connection state machine of the V2 protocol, as one table.

Which command a connection may send in which state, the state it is in after
the command succeeds, and nsqd v1.3.0's error for a command sent in the wrong
state.  nsqd (and so fakensq's client connection) answers a violation with
that ``E_INVALID`` error and closes the connection; trionsq's
:class:`~trionsq.connection.Connection` refuses to send it.

nsqd keeps a client in one of three states while it reads commands:

- ``INIT``: after the magic.  IDENTIFY and AUTH do not leave it: nsqd v1.3.0
  checks only ``state == stateInit`` for both, so a second IDENTIFY passes the
  state check (the tests in tests/conformance compare this with the real nsqd);
- ``SUBSCRIBED``: after a successful SUB; messages flow once RDY > 0;
- ``CLOSING``: after CLS; nsqd sends no more messages, the client finishes the
  ones it holds.  RDY is then accepted and ignored.

Publishing (PUB, MPUB, DPUB) and NOP are valid in every state.  Checks that
depend on options rather than on the state (TLS required, heartbeats needed
for SUB, authorization) stay with the server.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from .errors import InvalidError

__all__ = [
    "RULES",
    "ConnState",
    "Rule",
    "check",
    "command_name",
    "is_ignored",
    "state_after",
    "watched",
]


class ConnState(enum.Enum):
    """The states of a V2 connection, as nsqd names them (``stateInit``...)."""

    INIT = "init"
    SUBSCRIBED = "subscribed"
    CLOSING = "closing"


INIT = ConnState.INIT
SUBSCRIBED = ConnState.SUBSCRIBED
CLOSING = ConnState.CLOSING
_ALL = frozenset(ConnState)


@dataclass(frozen=True, slots=True)
class Rule:
    """One command's row of the table."""

    #: The states in which the command is valid.
    valid_in: frozenset[ConnState]
    #: nsqd's E_INVALID text when it is sent in another state ("" when valid in all).
    error: str = ""
    #: The state after the command succeeds (None: unchanged).
    then: ConnState | None = None
    #: States in which nsqd accepts the command and does nothing.
    ignored_in: frozenset[ConnState] = frozenset()


def _only(*states: ConnState, command: str, then: ConnState | None = None) -> Rule:
    return Rule(frozenset(states), f"cannot {command} in current state", then)


#: The table, by command name as it is on the wire.
RULES: Mapping[bytes, Rule] = {
    b"IDENTIFY": _only(INIT, command="IDENTIFY"),
    b"AUTH": _only(INIT, command="AUTH"),
    b"SUB": _only(INIT, command="SUB", then=SUBSCRIBED),
    b"RDY": Rule(
        frozenset({SUBSCRIBED, CLOSING}),
        "cannot RDY in current state",
        ignored_in=frozenset({CLOSING}),
    ),
    b"FIN": _only(SUBSCRIBED, CLOSING, command="FIN"),
    b"REQ": _only(SUBSCRIBED, CLOSING, command="REQ"),
    b"TOUCH": _only(SUBSCRIBED, CLOSING, command="TOUCH"),
    b"CLS": _only(SUBSCRIBED, command="CLS", then=CLOSING),
    b"PUB": Rule(_ALL),
    b"MPUB": Rule(_ALL),
    b"DPUB": Rule(_ALL),
    b"NOP": Rule(_ALL),
}


def _errors_in(state: ConnState) -> dict[bytes, str]:
    return {name: rule.error for name, rule in RULES.items() if state not in rule.valid_in}


# The table by state: the commands invalid in it and their errors.  ``check``
# runs for every command a server reads, so it picks the state's row by
# identity (an Enum member's hash is a Python-level call) and makes one lookup.
_ERRORS_INIT: Final = _errors_in(INIT)
_ERRORS_SUBSCRIBED: Final = _errors_in(SUBSCRIBED)
_ERRORS_CLOSING: Final = _errors_in(CLOSING)


def check(state: ConnState, command: bytes) -> None:
    """Raise nsqd's :class:`InvalidError` if ``command`` is not valid in ``state``.

    A name not in the table (not a command) passes: the parser answers those
    (``E_INVALID invalid command``)."""
    if state is SUBSCRIBED:
        error = _ERRORS_SUBSCRIBED.get(command)
    elif state is INIT:
        error = _ERRORS_INIT.get(command)
    else:
        error = _ERRORS_CLOSING.get(command)
    if error is not None:
        raise InvalidError(error)


def is_ignored(state: ConnState, command: bytes) -> bool:
    """Whether nsqd accepts ``command`` in ``state`` and does nothing with it."""
    rule = RULES.get(command)
    return rule is not None and state in rule.ignored_in


def state_after(state: ConnState, command: bytes) -> ConnState:
    """The state once ``command`` has succeeded (a command not valid in
    ``state`` never succeeds: the state is unchanged)."""
    rule = RULES.get(command)
    if rule is None or rule.then is None or state not in rule.valid_in:
        return state
    if state in rule.ignored_in:
        return state
    return rule.then


def command_name(data: bytes) -> bytes:
    """The name of the command that ``data`` (an encoded command) starts with."""
    line_end = data.find(b"\n")
    if line_end < 0:
        line_end = len(data)
    space = data.find(b" ", 0, line_end)
    return data[: space if space >= 0 else line_end]


def watched(state: ConnState) -> frozenset[int]:
    """The first bytes of the commands that are invalid in ``state`` or leave it.

    A sender can skip the table for any other command after one look at its
    first byte: in the states a busy connection spends its life in (INIT for a
    producer, SUBSCRIBED for a consumer), PUB and FIN are never looked up.
    """
    return frozenset(
        name[0]
        for name, rule in RULES.items()
        if state not in rule.valid_in or (rule.then is not None and rule.then is not state)
    )
