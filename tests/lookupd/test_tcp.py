"""nsqlookupd's TCP protocol V1, spoken byte by byte."""

from __future__ import annotations

import json
import socket
import struct

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from fakensq.lookupd import tcp as lookupd_tcp
from fakensq.lookupd.daemon import NSQLookupd, Registration

from .conftest import V1Client, registered_client


async def test_identify_answers_with_lookupd_info(lookupd: NSQLookupd) -> None:
    client = await V1Client.connect(lookupd.tcp_address)
    raw = await client.identify()
    assert raw is not None
    info = json.loads(raw)
    assert list(info) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
    assert info["tcp_port"] == lookupd.tcp_port
    assert info["http_port"] == lookupd.http_port
    assert info["broadcast_address"] == "lookupd.test"
    assert info["hostname"] == socket.gethostname()
    assert info["version"] == "1.3.0"
    await client.aclose()


async def test_ping_before_and_after_identify(lookupd: NSQLookupd) -> None:
    client = await V1Client.connect(lookupd.tcp_address)
    assert await client.command("PING") == b"OK"
    await client.identify()
    assert await client.command("PING") == b"OK"
    await client.aclose()


async def test_register_and_unregister(lookupd: NSQLookupd) -> None:
    client = await registered_client(lookupd, "t1", "t2 c1", "t2 c2")
    assert lookupd.topics() == ["t1", "t2"]
    assert lookupd.channels("t2") == ["c1", "c2"]
    assert [p.tcp_port for p in lookupd.producers("t2")] == [4150]
    assert await client.command("UNREGISTER t2 c1") == b"OK"
    # A non-ephemeral channel stays registered with no producers.
    assert lookupd.channels("t2") == ["c1", "c2"]
    assert lookupd.db.find_producers("channel", "t2", "c1") == []
    assert await client.command("UNREGISTER t2") == b"OK"
    # Unregistering the topic removed this producer from its channels too.
    assert lookupd.db.find_producers("channel", "t2", "c2") == []
    assert lookupd.producers("t2") == []
    assert lookupd.topics() == ["t1", "t2"]
    await client.aclose()


async def test_ephemeral_channel_and_topic_go_with_last_producer(lookupd: NSQLookupd) -> None:
    a = await registered_client(lookupd, "t c#ephemeral", "e#ephemeral")
    b = await registered_client(lookupd, "t c#ephemeral", tcp_port=5150)
    assert await a.command("UNREGISTER t c#ephemeral") == b"OK"
    assert lookupd.channels("t") == ["c#ephemeral"]
    assert await b.command("UNREGISTER t c#ephemeral") == b"OK"
    assert lookupd.channels("t") == []
    assert await a.command("UNREGISTER e#ephemeral") == b"OK"
    assert "e#ephemeral" not in lookupd.topics()
    await a.aclose()
    await b.aclose()


async def test_disconnect_removes_producer_everywhere(lookupd: NSQLookupd) -> None:
    client = await registered_client(lookupd, "t c")
    assert len(lookupd.nodes()) == 1
    await client.aclose()
    with trio.fail_after(5):
        await lookupd.wait_until(lambda: not lookupd.db.has_producers())
    assert lookupd.nodes() == []
    assert lookupd.topics() == ["t"]
    assert lookupd.channels("t") == ["c"]


async def expect_fatal(client: V1Client, line: bytes, error: bytes) -> None:
    await client.send(line)
    assert await client.read_response() == error
    assert await client.closed()


async def test_register_requires_identify(lookupd: NSQLookupd) -> None:
    client = await V1Client.connect(lookupd.tcp_address)
    await expect_fatal(client, b"REGISTER t\n", b"E_INVALID client must IDENTIFY")
    client = await V1Client.connect(lookupd.tcp_address)
    await expect_fatal(client, b"UNREGISTER t\n", b"E_INVALID client must IDENTIFY")


async def test_errors_are_fatal_with_nsqlookupd_texts(lookupd: NSQLookupd) -> None:
    cases = [
        (b"NOPE\n", b"E_INVALID invalid command NOPE"),
        (b"\n", b"E_INVALID invalid command "),
        (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
        (b"REGISTER a/b\n", b"E_BAD_TOPIC REGISTER topic name 'a/b' is not valid"),
        (b"UNREGISTER t c!\n", b"E_BAD_CHANNEL UNREGISTER channel name 'c!' is not valid"),
        (b"REGISTER  t\n", b"E_BAD_TOPIC REGISTER topic name '' is not valid"),
    ]
    for line, error in cases:
        client = await V1Client.connect(lookupd.tcp_address)
        await client.identify()
        await expect_fatal(client, line, error)
    client = await V1Client.connect(lookupd.tcp_address)
    await client.identify()
    await client.send(b"IDENTIFY\n")
    assert await client.read_response() == b"E_INVALID cannot IDENTIFY again"
    assert await client.closed()


async def test_identify_body_errors(lookupd: NSQLookupd) -> None:
    def body(raw: bytes) -> bytes:
        return b"IDENTIFY\n" + struct.pack(">l", len(raw)) + raw

    cases = [
        (body(b"{not json"), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (body(b"[1]"), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (body(b'{"tcp_port": "4150"}'), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (body(b'{"tcp_port": 1}'), b"E_BAD_BODY IDENTIFY missing fields"),
        (body(b"null"), b"E_BAD_BODY IDENTIFY missing fields"),
    ]
    for data, error in cases:
        client = await V1Client.connect(lookupd.tcp_address)
        await expect_fatal(client, data, error)
    # A negative size kills nsqlookupd v1.3.0 (a panic): the connection closes
    # without an answer; fakensq closes that connection alone.
    client = await V1Client.connect(lookupd.tcp_address)
    await client.send(b"IDENTIFY\n" + struct.pack(">l", -1))
    assert await client.read_response() is None
    # Go's decoder matches keys case-insensitively.
    client = await V1Client.connect(lookupd.tcp_address)
    raw = json.dumps(
        {"BROADCAST_ADDRESS": "h", "Tcp_Port": 1, "http_port": 2, "version": "v", "x": 1}
    ).encode()
    await client.send(body(raw))
    assert json.loads(await client.read_response() or b"")["tcp_port"] == lookupd.tcp_port
    await client.aclose()


async def test_truncated_identify_body_is_an_error(lookupd: NSQLookupd) -> None:
    client = await V1Client.connect(lookupd.tcp_address)
    await client.send(b"IDENTIFY\n" + struct.pack(">l", 100) + b"{}")
    await client.stream.send_eof()
    assert await client.read_response() == b"E_BAD_BODY IDENTIFY failed to read body"


async def test_bad_magic(lookupd: NSQLookupd) -> None:
    client = await V1Client.connect(lookupd.tcp_address, magic=b"  V2")
    assert await client.read_response() == b"E_BAD_PROTOCOL"
    assert await client.closed()


async def test_garbage_never_crashes_the_server(lookupd: NSQLookupd) -> None:
    overlong = b"  V1" + b"x" * (lookupd_tcp._MAX_LINE + 1)
    for junk in (b"\xff\xfe\x00garbage\n", overlong, b"  V1\x00\x00\n"):
        client = await V1Client.connect(lookupd.tcp_address, magic=b"")
        await client.send(junk)
        await client.closed()
    client = await V1Client.connect(lookupd.tcp_address)
    assert await client.command("PING") == b"OK"
    await client.aclose()


async def test_reregister_keeps_one_producer(lookupd: NSQLookupd) -> None:
    client = await registered_client(lookupd, "t", "t", "t c")
    assert len(lookupd.db.find_producers("topic", "t", "")) == 1
    assert lookupd.db.find_registrations("channel", "t", "*") == [Registration("channel", "t", "c")]
    await client.aclose()


@settings(max_examples=60)
@given(
    data=st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.sampled_from(
                [
                    b"IDENTIFY\n",
                    b"REGISTER t\n",
                    b"UNREGISTER t c\n",
                    b"PING\n",
                    b"\x00\x00\x00\x02{}",
                ]
            ),
        ),
        max_size=6,
    )
)
async def test_fuzzed_commands_never_crash_the_server(data: list[bytes]) -> None:
    async with NSQLookupd() as lookupd:
        client = await V1Client.connect(lookupd.tcp_address)
        try:
            await client.send(b"".join(data))
            await client.stream.send_eof()
            await client.closed()
        except trio.BrokenResourceError:
            pass
        fresh = await V1Client.connect(lookupd.tcp_address)
        assert await fresh.command("PING") == b"OK"
        await fresh.aclose()
