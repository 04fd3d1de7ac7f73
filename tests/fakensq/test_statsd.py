"""nsqd's statsd push (fakensq.nsqd.statsd): names, values, packets, prefix."""

from __future__ import annotations

import trio
import trio.testing

import fakensq
from fakensq.nsqd.statsd import pack_packets, statsd_prefix


def test_prefix_is_nsqds() -> None:
    assert statsd_prefix("nsq.%s", "10.0.0.1", 4151) == "nsq.10_0_0_1_4151."
    assert statsd_prefix("app.", "h", 1) == "app."
    assert statsd_prefix("", "h", 1) == ""


def test_packets_hold_whole_lines_within_the_size() -> None:
    lines = [b"a" * 10 + b"\n"] * 5
    packets = pack_packets(lines, 25)
    assert packets == [lines[0] * 2] * 2 + [lines[0]]
    assert pack_packets([b"x" * 40 + b"\n"], 25) == [b"x" * 40 + b"\n"]  # alone


async def test_pushes_every_interval(autojump_clock: trio.testing.MockClock) -> None:
    udp = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
    await udp.bind(("127.0.0.1", 0))
    host, port = udp.getsockname()
    nsqd = fakensq.NSQD(
        tcp_address="",
        http_address="",
        broadcast_address="node.local",
        broadcast_http_port=4151,
        statsd_address=f"{host}:{port}",
        statsd_interval=10.0,
        statsd_mem_stats=False,
        statsd_udp_packet_size=200,
    )
    with udp:
        async with nsqd:
            topic = nsqd.get_topic("t")
            channel = topic.get_channel("c")
            channel.pause()  # keeps the messages queued
            for body in (b"a", b"bb", b"ccc"):
                topic.put(topic.new_message(body))
            start = trio.current_time()
            packets = []
            lines: list[str] = []
            with trio.fail_after(60):
                while not any("channel.c.clients" in line for line in lines):
                    packet = await udp.recv(65536)
                    packets.append(packet)
                    lines += packet.decode().splitlines()
            # Sent after one interval, in datagrams of whole lines within the size.
            assert trio.current_time() - start == 10.0
            assert all(len(p) <= 200 and p.endswith(b"\n") for p in packets)
            p = "nsq.node_local_4151."
            assert lines == [
                f"{p}topic.t.message_count:3|c",
                f"{p}topic.t.message_bytes:6|c",
                f"{p}topic.t.depth:0|g",
                f"{p}topic.t.backend_depth:0|g",
                f"{p}topic.t.channel.c.message_count:3|c",
                f"{p}topic.t.channel.c.depth:3|g",
                f"{p}topic.t.channel.c.backend_depth:0|g",
                f"{p}topic.t.channel.c.in_flight_count:0|g",
                f"{p}topic.t.channel.c.deferred_count:0|g",
                f"{p}topic.t.channel.c.requeue_count:0|c",
                f"{p}topic.t.channel.c.timeout_count:0|c",
                f"{p}topic.t.channel.c.clients:0|g",
            ]
            # Counters are increases since the last push.
            topic.put(topic.new_message(b"d"))
            second: list[str] = []
            with trio.fail_after(60):
                while not any("channel.c.clients" in line for line in second):
                    second += (await udp.recv(65536)).decode().splitlines()
            assert f"{p}topic.t.message_count:1|c" in second
            assert f"{p}topic.t.channel.c.depth:4|g" in second


async def test_mem_stats_and_e2e_percentiles() -> None:
    from fakensq.nsqd.statsd import collect_lines

    async with fakensq.NSQD(
        tcp_address="", http_address="", e2e_processing_latency_percentiles=[0.99]
    ) as nsqd:
        nsqd.get_topic("t").get_channel("c")
        lines, _, mem = collect_lines(nsqd, "p.", {}, {})
        names = {line.decode().split(":")[0] for line in lines}
        assert {"p.mem.heap_objects", "p.mem.gc_pause_usec_99", "p.mem.gc_runs"} <= names
        assert b"p.mem.gc_pause_usec_99:0|g\n" in lines
        assert "p.topic.t.channel.c.e2e_processing_latency_99" in names
        assert mem["gc_total_runs"] >= 0
