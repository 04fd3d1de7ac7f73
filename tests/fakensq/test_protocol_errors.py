"""nsqd's error frames, texts and fatality, command by command."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

import fakensq
from trionsq.protocol import commands as cmds

from .helpers import RawClient, memory_client


@pytest.fixture
async def nsqd() -> AsyncIterator[fakensq.NSQD]:
    async with fakensq.NSQD(tcp_address="", http_address="") as node:
        yield node


async def _error_then_closed(c: RawClient, expected: bytes) -> None:
    assert await c.read_error() == expected
    await c.expect_closed()


async def test_bad_magic(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    c = await memory_client(nsqd, nursery, magic=False)
    await c.send(b"  V1")
    await _error_then_closed(c, b"E_BAD_PROTOCOL")


async def test_invalid_command(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    c = await memory_client(nsqd, nursery)
    await c.send(b"HELLO world\n")
    await _error_then_closed(c, b"E_INVALID invalid command HELLO")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (cmds.fin(b"0" * 16), b"E_INVALID cannot FIN in current state"),
        (cmds.req(b"0" * 16, 0), b"E_INVALID cannot REQ in current state"),
        (cmds.touch(b"0" * 16), b"E_INVALID cannot TOUCH in current state"),
        (cmds.rdy(1), b"E_INVALID cannot RDY in current state"),
        (cmds.cls(), b"E_INVALID cannot CLS in current state"),
        (b"SUB t\n", b"E_INVALID SUB insufficient number of parameters"),
        (b"SUB a|b c\n", b'E_BAD_TOPIC SUB topic name "a|b" is not valid'),
        (cmds.pub("t", b""), b"E_BAD_MESSAGE PUB invalid message body size 0"),
        (cmds.auth("s"), b"E_AUTH_DISABLED AUTH disabled"),
        (
            cmds.identify({"heartbeat_interval": 999}),
            b"E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid",
        ),
        (
            cmds.identify({"output_buffer_size": 63}),
            b"E_BAD_BODY IDENTIFY output buffer size (63) is invalid",
        ),
        (
            cmds.identify({"output_buffer_timeout": 1}),
            b"E_BAD_BODY IDENTIFY output buffer timeout (1) is invalid",
        ),
        (cmds.identify({"sample_rate": 100}), b"E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
        (cmds.identify({"msg_timeout": 999}), b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
        (
            cmds.identify({"msg_timeout": 900001}),
            b"E_BAD_BODY IDENTIFY msg timeout (900001) is invalid",
        ),
        (b"IDENTIFY\n\x00\x00\x00\x03{x}", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"IDENTIFY\n\x00\x00\x00\x02[]", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (
            cmds.identify({"heartbeat_interval": 1.5}),
            b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        ),
        (cmds.identify({"snappy": "yes"}), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (
            cmds.identify({"feature_negotiation": True, "snappy": True, "deflate": True}),
            b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
        ),
    ],
)
async def test_fatal_errors_before_sub(
    nsqd: fakensq.NSQD, nursery: trio.Nursery, data: bytes, error: bytes
) -> None:
    c = await memory_client(nsqd, nursery)
    await c.send(data)
    await _error_then_closed(c, error)


async def test_identify_json_is_lenient_like_go(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    c = await memory_client(nsqd, nursery)
    # case-insensitive keys, unknown keys and nulls ignored
    await c.send(cmds.identify({"Client_ID": "x", "whatever": [1.5], "hostname": None}))
    assert await c.read_response() == b"OK"
    await c.send(b"IDENTIFY\n\x00\x00\x00\x04null")
    assert await c.read_response() == b"OK"
    stats = nsqd.clients[max(nsqd.clients)].stats()
    assert stats["client_id"] == ""  # the second IDENTIFY reset it, as nsqd does


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (cmds.identify({}), b"E_INVALID cannot IDENTIFY in current state"),
        (cmds.sub("t", "d"), b"E_INVALID cannot SUB in current state"),
        (cmds.auth("x"), b"E_INVALID cannot AUTH in current state"),
        (cmds.rdy(2501), b"E_INVALID RDY count 2501 out of range 0-2500"),
        (b"RDY x\n", b"E_INVALID RDY could not parse count x"),
        (b"FIN 123\n", b"E_INVALID invalid message ID"),
        (b"REQ 0000000000000000\n", b"E_INVALID REQ insufficient number of params"),
    ],
)
async def test_fatal_errors_after_sub(
    nsqd: fakensq.NSQD, nursery: trio.Nursery, data: bytes, error: bytes
) -> None:
    c = await memory_client(nsqd, nursery)
    await c.sub("t", "c")
    await c.send(data)
    await _error_then_closed(c, error)


async def test_sub_with_heartbeats_disabled(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    c = await memory_client(nsqd, nursery)
    await c.identify(heartbeat_interval=-1)
    await c.send(b"SUB\n")  # checked before the parameters
    await _error_then_closed(c, b"E_INVALID cannot SUB with heartbeats disabled")


async def test_non_fatal_fin_req_touch(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    a = await memory_client(nsqd, nursery)
    b = await memory_client(nsqd, nursery)
    await a.sub("t", "c", rdy=1)
    await b.sub("t", "c")
    topic = nsqd.get_topic("t")
    topic.put(topic.new_message(b"x"))
    msg = await a.read_message()
    mid = msg.id.decode()
    for data, text in [
        (cmds.fin(msg.id), f"E_FIN_FAILED FIN {mid} failed client does not own message"),
        (cmds.req(msg.id, 0), f"E_REQ_FAILED REQ {mid} failed client does not own message"),
        (cmds.touch(msg.id), f"E_TOUCH_FAILED TOUCH {mid} failed client does not own message"),
        (cmds.fin(b"f" * 16), "E_FIN_FAILED FIN ffffffffffffffff failed ID not in flight"),
    ]:
        await b.send(data)
        assert await b.read_error() == text.encode()
    # b is still connected
    await b.pub("t", b"still here")
    await a.send(cmds.fin(msg.id))
    assert (await a.read_message()).body == b"still here"
    await a.send(cmds.fin(msg.id))
    assert await a.read_error() == f"E_FIN_FAILED FIN {mid} failed ID not in flight".encode()


async def test_rdy_after_cls_is_ignored(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    c = await memory_client(nsqd, nursery)
    await c.sub("t", "c")
    await c.send(cmds.cls())
    assert await c.read_response() == b"CLOSE_WAIT"
    await c.send(b"RDY notanumber\n")
    await c.send(cmds.nop())
    await c.pub("t", b"x")  # still connected, got nothing since RDY is 0


async def test_tls_required(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="", tls_required=2) as nsqd:
        c = await memory_client(nsqd, nursery)
        await c.send(b"BOGUS\n")
        await _error_then_closed(c, b"E_INVALID cannot BOGUS in current state (TLS required)")
        c = await memory_client(nsqd, nursery)
        assert await c.identify(feature_negotiation=False) == b"OK"
        await c.send(cmds.pub("t", b"x"))
        await _error_then_closed(c, b"E_INVALID cannot PUB in current state (TLS required)")


async def test_max_channel_consumers(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="", max_channel_consumers=1) as nsqd:
        a = await memory_client(nsqd, nursery)
        await a.sub("t", "c")
        b = await memory_client(nsqd, nursery)
        await b.send(cmds.sub("t", "c"))
        await _error_then_closed(b, b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")


async def test_line_too_long_closes_silently(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    c = await memory_client(nsqd, nursery)
    await c.send(b"NOP" + b" " * 20000)
    await c.expect_closed()


async def test_req_timeout_is_clamped(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="", max_req_timeout=10.0) as nsqd:
        c = await memory_client(nsqd, nursery)
        await c.sub("t", "c", rdy=1)
        topic = nsqd.get_topic("t")
        topic.put(topic.new_message(b"x"))
        msg = await c.read_message()
        start = trio.current_time()
        await c.send(cmds.req(msg.id, 10_000_000))
        msg = await c.read_message()
        assert 10.0 <= trio.current_time() - start <= 10.3
        assert msg.attempts == 2
