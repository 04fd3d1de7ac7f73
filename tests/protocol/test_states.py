"""The connection state machine (trionsq.protocol.states): the table itself, and
both sides that read it paired in memory against it: fakensq's client
connection (what nsqd answers) and trionsq's Connection (what it refuses to
send).  The texts are nsqd v1.3.0's; tests/conformance compares fakensq's
answers with the real nsqd's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fakensq
from fakensq.nsqd.client import ClientConnection
from trionsq.config import Config
from trionsq.connection import Connection
from trionsq.protocol import commands as cmds
from trionsq.protocol import states
from trionsq.protocol.errors import InvalidError
from trionsq.protocol.frames import Error, MessageFrame, Response
from trionsq.protocol.states import CLOSING, INIT, SUBSCRIBED, ConnState

from ..fakensq.helpers import RawClient, memory_client

MSG_ID = b"0" * 16

#: One well-formed instance of each command in the table.
EXAMPLES: dict[bytes, bytes] = {
    b"IDENTIFY": cmds.identify({"client_id": "states"}),
    b"AUTH": cmds.auth("secret"),
    b"SUB": cmds.sub("t", "c"),
    b"RDY": cmds.rdy(1),
    b"FIN": cmds.fin(MSG_ID),
    b"REQ": cmds.req(MSG_ID, 0),
    b"TOUCH": cmds.touch(MSG_ID),
    b"CLS": cmds.cls(),
    b"PUB": cmds.pub("t", b"x"),
    b"MPUB": cmds.mpub("t", [b"x", b"y"]),
    b"DPUB": cmds.dpub("t", 1000, b"x"),
    b"NOP": cmds.nop(),
}

#: The commands that take a connection from INIT to each state.
PATHS: dict[ConnState, list[bytes]] = {
    INIT: [],
    SUBSCRIBED: [b"SUB"],
    CLOSING: [b"SUB", b"CLS"],
}


# --- the table ----------------------------------------------------------------


def test_every_command_has_a_row_and_an_example() -> None:
    assert set(states.RULES) == set(EXAMPLES)
    for name, data in EXAMPLES.items():
        assert states.command_name(data) == name


@pytest.mark.parametrize(
    ("state", "valid"),
    [
        (INIT, {b"IDENTIFY", b"AUTH", b"SUB", b"PUB", b"MPUB", b"DPUB", b"NOP"}),
        (
            SUBSCRIBED,
            {b"RDY", b"FIN", b"REQ", b"TOUCH", b"CLS", b"PUB", b"MPUB", b"DPUB", b"NOP"},
        ),
        (CLOSING, {b"RDY", b"FIN", b"REQ", b"TOUCH", b"PUB", b"MPUB", b"DPUB", b"NOP"}),
    ],
)
def test_which_command_is_valid_in_which_state(state: ConnState, valid: set[bytes]) -> None:
    for name in states.RULES:
        if name in valid:
            states.check(state, name)
        else:
            with pytest.raises(InvalidError) as info:
                states.check(state, name)
            assert info.value.to_bytes() == b"E_INVALID cannot " + name + b" in current state"
            assert info.value.fatal


def test_transitions() -> None:
    assert states.state_after(INIT, b"SUB") is SUBSCRIBED
    assert states.state_after(SUBSCRIBED, b"CLS") is CLOSING
    # IDENTIFY and AUTH do not leave INIT (nsqd v1.3.0); nothing leaves CLOSING.
    for name in states.RULES:
        if name != b"SUB":
            assert states.state_after(INIT, name) is INIT
        assert states.state_after(CLOSING, name) is CLOSING
    assert states.is_ignored(CLOSING, b"RDY")
    assert not states.is_ignored(SUBSCRIBED, b"RDY")


def test_watched_first_bytes_cover_every_command_that_matters() -> None:
    for state in ConnState:
        watched = states.watched(state)
        for name, rule in states.RULES.items():
            matters = state not in rule.valid_in or states.state_after(state, name) != state
            if matters:
                assert name[0] in watched, (state, name)
    # The busy paths are never looked up.
    assert ord("P") not in states.watched(INIT)
    assert ord("F") not in states.watched(SUBSCRIBED)


def test_command_name() -> None:
    assert states.command_name(b"CLS\n") == b"CLS"
    assert states.command_name(b"FIN 0123\n") == b"FIN"
    assert states.command_name(b"IDENTIFY\n\x00\x00\x00\x02{}") == b"IDENTIFY"
    assert states.command_name(b"NOP") == b"NOP"


# --- the two sides, in memory -------------------------------------------------


def client_side() -> Connection:
    """A trionsq Connection that is never run: what it queues is only kept."""
    stream, _peer = trio.testing.memory_stream_pair()
    return Connection.over(stream, "memory", Config())


class ServerSide:
    """A raw client of an in-memory fakensq nsqd, reading its answers."""

    def __init__(self, raw: RawClient, connection: Callable[[], ClientConnection]) -> None:
        self.raw = raw
        self.connection = connection
        self.closed = False

    async def send(self, name: bytes) -> bytes | None:
        """Send ``name``'s example: the error it answers (None: no error)."""
        await self.raw.send(EXAMPLES[name])
        with trio.move_on_after(5):  # virtual time: what nsqd answers comes at once
            while True:
                frame = await self.raw.read_frame()
                if isinstance(frame, MessageFrame):
                    continue  # a message published earlier, handed out meanwhile
                if isinstance(frame, Error):
                    body = frame.data
                    if frame_is_fatal(body):
                        await self.raw.expect_closed()
                        self.closed = True
                    return body
                assert isinstance(frame, Response)
                return None
        return None


def frame_is_fatal(body: bytes) -> bool:
    return not body.startswith((b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED"))


async def open_server_side(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> ServerSide:
    before = set(nsqd.clients)
    raw = await memory_client(nsqd, nursery)
    await raw.identify()
    (client_id,) = set(nsqd.clients) - before
    return ServerSide(raw, lambda: nsqd.clients[client_id])


@pytest.mark.parametrize("state", list(ConnState))
@pytest.mark.parametrize("name", list(EXAMPLES))
async def test_both_sides_follow_the_table(
    state: ConnState, name: bytes, autojump_clock: trio.testing.MockClock
) -> None:
    rule = states.RULES[name]
    async with (
        fakensq.NSQD(tcp_address="", http_address="") as nsqd,
        trio.open_nursery() as nursery,
    ):
        server = await open_server_side(nsqd, nursery)
        client = client_side()
        for step in PATHS[state]:
            assert await server.send(step) is None
            client.send_nowait(EXAMPLES[step])
        assert server.connection().state is state
        assert client.state is state

        expected_error = None if state in rule.valid_in else b"E_INVALID " + rule.error.encode()
        if expected_error is None:
            client.send_nowait(EXAMPLES[name])
            after = states.state_after(state, name)
            assert client.state is after
            answer = await server.send(name)
            # A valid command may fail for other reasons (no message in
            # flight, auth disabled), never for the state.
            assert answer is None or b"in current state" not in answer
            if not server.closed:
                assert server.connection().state is after
        else:
            with pytest.raises(InvalidError) as info:
                client.send_nowait(EXAMPLES[name])
            assert info.value.to_bytes() == expected_error
            assert client.state is state  # refused: nothing queued, nothing changed
            assert await server.send(name) == expected_error
            assert server.closed
        nursery.cancel_scope.cancel()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(sorted(EXAMPLES)), min_size=1, max_size=8))
def test_random_sequences_agree(sequence: list[bytes]) -> None:
    """Client and server, command after command: the client refuses exactly what
    nsqd answers with a state error, and both are in the same state after."""

    async def main() -> None:
        async with (
            fakensq.NSQD(tcp_address="", http_address="") as nsqd,
            trio.open_nursery() as nursery,
        ):
            server = await open_server_side(nsqd, nursery)
            client = client_side()
            for name in sequence:
                try:
                    client.send_nowait(EXAMPLES[name])
                    refused = None
                except InvalidError as exc:
                    refused = exc.to_bytes()
                answer = await server.send(name)
                if refused is not None:
                    assert answer == refused
                    break
                assert answer is None or b"in current state" not in answer
                if server.closed:
                    break  # another fatal error (such as AUTH disabled)
                assert server.connection().state is client.state
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
