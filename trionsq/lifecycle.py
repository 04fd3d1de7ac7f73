"""An object's life as one state, moved in one place.

Objects with a life (started, used, closed) keep it as one value of an enum,
not as a handful of flags, and change it in one place, as h11 keeps a
connection's states: a table (:class:`Moves`) lists, for each state, the states
the object may go to, and :meth:`Lifecycle.move` is the only way the state
changes; a move the table does not list raises :class:`LifecycleError`.  The
object's code still decides *when* to move (that is its behaviour); the table
says which moves exist, so a reader sees the whole life in a few lines and a
wrong move is an error where it happens, not a state nobody expected later.

:class:`Life` is the life of the front ends' clients (the blocking and asyncio
Consumer and Producer); each declares its own table of moves over it, and
:class:`BlockingClient` and :class:`AsyncClient` hold what their ``with`` and
``async with`` do with it; :class:`AsyncContext`, how every client used as
``async with`` (Trio's Consumer and Producer too) is left.
"""

from __future__ import annotations

import abc
import asyncio
import enum
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Generic, Self, TypeVar

__all__ = [
    "AsyncClient",
    "AsyncContext",
    "BlockingClient",
    "Life",
    "Lifecycle",
    "LifecycleError",
    "Moves",
    "State",
]

S = TypeVar("S", bound="State")


class State(enum.Enum):
    """The base of an enum of states that a :class:`Moves` table moves.

    Members are singletons: hashed by identity (a C slot), not by Enum's
    Python-level hash of the name; a table's lookup is then a dict's, and some
    objects move once a request.
    """

    __hash__ = object.__hash__


class Life(State):
    """The states of an object's life (a connection's, a consumer's, a front
    end's client's: each lives some of them, see its table)."""

    #: made, not started (or, for a blocking Producer, forked and not restarted)
    NEW = "new"
    #: being started (an asyncio client's ``async with`` is being entered)
    OPENING = "opening"
    #: started: it can be used
    OPEN = "open"
    #: being closed: nothing new is handed out, what was is settled
    CLOSING = "closing"
    #: closed for good: calls raise ``ClientClosedError``
    CLOSED = "closed"
    #: started in a parent process before a ``fork()``: its loop's thread does
    #: not exist in this (the child) process
    FORKED = "forked"


NEW = Life.NEW
OPENING = Life.OPENING
OPEN = Life.OPEN
CLOSING = Life.CLOSING
CLOSED = Life.CLOSED
FORKED = Life.FORKED


class LifecycleError(RuntimeError):
    """A move that the object's table of moves does not allow."""


class Moves(Generic[S]):
    """One kind of object's table: from each state, the states it may move to.

    ``refusals`` gives, for some target states, the text of the error a move
    there from another state raises (formatted with ``{state}``, the state's
    value), where that error is what the object's caller is meant to see (``a
    Consumer can be started only once``); other wrong moves are bugs, and say
    so.  A state missing from ``table`` (or mapped to nothing) is final.
    """

    __slots__ = ("initial", "name", "refusals", "table")

    def __init__(
        self,
        name: str,
        initial: S,
        table: Mapping[S, Iterable[S]],
        refusals: Mapping[S, str] | None = None,
    ) -> None:
        self.name = name
        self.initial = initial
        self.table: dict[S, frozenset[S]] = {
            state: frozenset(targets) for state, targets in table.items()
        }
        self.refusals: dict[S, str] = dict(refusals or {})

    def allows(self, state: S, to: S) -> bool:
        """Whether the table has the move from ``state`` to ``to``."""
        return to in self.table.get(state, ())

    def refusal(self, state: S, to: S) -> LifecycleError:
        """The error for the move from ``state`` to ``to``, which it does not allow."""
        text = self.refusals.get(to)
        if text is not None:
            return LifecycleError(text.format(state=state.value))
        return LifecycleError(f"{self.name}: no move from {state.value} to {to.value}")


class Lifecycle(Generic[S]):
    """The state of one object and its table; :meth:`move` is how it changes.

    :attr:`state` is read freely (from any thread: a store of one attribute is
    atomic under the GIL); only :meth:`move` writes it.  Objects that move it
    from several threads hold their own lock around the move and what goes
    with it.
    """

    __slots__ = ("_table", "moves", "state")

    def __init__(self, moves: Moves[S]) -> None:
        self.moves = moves
        self.state: S = moves.initial
        self._table = moves.table  # (one lookup less a move: some are per request)

    def move(self, to: S) -> S:
        """Go to ``to``; returns the state left.  Raises :class:`LifecycleError`
        (and stays) if the table has no such move."""
        state = self.state
        if to not in self._table.get(state, ()):
            raise self.moves.refusal(state, to)
        self.state = to
        return state

    def __repr__(self) -> str:
        return f"<{self.moves.name} {self.state.value}>"


class _Client(abc.ABC):
    """A front end's client, whose life is a :class:`Lifecycle` of :class:`Life`."""

    _life: Lifecycle[Life]

    @property
    def closed(self) -> bool:
        """Whether the client is closed (for good)."""
        return self._life.state is CLOSED


class BlockingClient(_Client):
    """A blocking client: ``with`` calls :meth:`start`, leaving it closes
    (``interrupted`` when a ``KeyboardInterrupt`` leaves it: nothing waits)."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start the client; returns it."""

    @abc.abstractmethod
    def _leave(self, interrupted: bool) -> None:
        """Close, as leaving the ``with`` does."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave(exc_type is not None and issubclass(exc_type, KeyboardInterrupt))


class AsyncContext(abc.ABC):
    """Something used as ``async with``, left in one way: leaving calls
    :meth:`_exit_block` with the block's exception (``None`` when it ended
    cleanly), and that exception propagates unchanged (never suppressed)."""

    @abc.abstractmethod
    async def _exit_block(self, exc: BaseException | None) -> None:
        """Close what entering started; ``exc`` is what the block raised."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._exit_block(exc)


class AsyncClient(_Client, AsyncContext):
    """An asyncio client, entered once: ``async with`` opens it (NEW, OPENING,
    OPEN; CLOSED if opening fails) and :meth:`aclose` closes it (CLOSING, then
    CLOSED; at once from a state it never opened in).  Its table must have
    these moves."""

    @abc.abstractmethod
    async def _open(self) -> None:
        """Start the client (in OPENING)."""

    @abc.abstractmethod
    async def _close(self, interrupted: bool) -> None:
        """Close what :meth:`_open` started (in CLOSING, or in CLOSED when the
        client was closed while it opened)."""

    async def __aenter__(self) -> Self:
        life = self._life
        life.move(OPENING)
        try:
            await self._open()
        except BaseException:
            if life.state is not CLOSED:  # (an aclose() while it opened moved it already)
                life.move(CLOSED)
            raise
        if life.state is CLOSED:  # aclose() by another task while it opened
            await self._close(False)
            raise LifecycleError(f"{life.moves.name}: closed while it was being entered")
        life.move(OPEN)
        return self

    async def _exit_block(self, exc: BaseException | None) -> None:
        interrupted = isinstance(exc, asyncio.CancelledError | KeyboardInterrupt)
        await self.aclose(interrupted=interrupted)

    async def aclose(self, *, interrupted: bool = False) -> None:
        """Close (what leaving the ``async with`` does); ``interrupted=True``
        waits for nothing it can cut short.  Closing a client being closed by
        another task returns at once."""
        life = self._life
        state = life.state
        if state is OPEN:
            life.move(CLOSING)
            try:
                await self._close(interrupted)
            finally:
                life.move(CLOSED)
        elif state is not CLOSING and state is not CLOSED:
            life.move(CLOSED)
