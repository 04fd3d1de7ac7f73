"""nsqd's ``/stats``, JSON and text, every key, on fakensq and on nsqd v1.3.0.

One node state holds what ``/stats`` can show: a producer with publish counts,
a consumer with messages in flight, finished, requeued and deferred, a paused
channel, a paused topic, an ephemeral channel, a message deferred over HTTP.
Each filter and format is then compared whole: every key, its type, its value
(times and memory figures, which vary, only by type), JSON key order, and the
text layout.
"""

from __future__ import annotations

from typing import Any

import pytest

from trionsq.protocol import commands as cmds

from .conftest import Conformance, Target
from .httpcheck import mask_text_stats
from .normalize import Normalizer, type_only

MEMORY_KEYS = (
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
)


def _memory_by_type(n: Normalizer) -> None:
    for key in MEMORY_KEYS:
        n.key_rules[key] = type_only


async def build_state(t: Target) -> None:
    """The node state every case looks at (module doc)."""
    async with t.http() as http:
        for path in (
            "/topic/create?topic=t",
            "/channel/create?topic=t&channel=c",
            "/channel/create?topic=t&channel=c2",
            "/channel/pause?topic=t&channel=c2",
            "/topic/create?topic=p",
            "/channel/create?topic=p&channel=pc",
            "/topic/pause?topic=p",
        ):
            assert (await http.post(path)).status_code == 200
        assert (await http.post("/pub?topic=t&defer=600000", content=b"later")).status_code == 200
    producer = await t.connect("prod")
    await producer.identify(client_id="prod", hostname="prodhost", user_agent="producer/1.0")
    await producer.call(cmds.pub("t", b"m1"))
    await producer.call(cmds.pub("t", b"m2"))
    await producer.call(cmds.mpub("t", [b"m3", b"m4"]))
    await producer.call(cmds.dpub("t", 600000, b"deferred"))
    # nsqd v1.3.0 shows one topic of a producer's publish counts, the first of
    # a Go map's (random) order: one topic per producer keeps that determined.
    producer2 = await t.connect("prod2")
    await producer2.identify(client_id="prod2", hostname="prod2host", user_agent="p2")
    await producer2.call(cmds.pub("p", b"held"))
    consumer = await t.connect("cons")
    await consumer.identify(
        client_id="cons", hostname="conshost", user_agent="consumer/2.0", msg_timeout=60000
    )
    await consumer.sub("t", "c", rdy=2)
    first, second = await consumer.read_messages(2)
    await consumer.send(cmds.fin(first.id))
    await consumer.send(cmds.req(second.id, 600000))
    await consumer.read_messages(2)  # RDY 2 again: two more
    await consumer.sync()
    eph = await t.connect("eph")
    await eph.identify(client_id="eph", hostname="ephhost", user_agent="eph/3.0")
    await eph.sub("t", "e#ephemeral", rdy=0)
    await eph.sync()


FILTERS = [
    "",
    "include_clients=false",
    "include_clients=0",
    "include_clients=1",
    "include_clients=nope",
    "include_mem=false",
    "include_mem=0",
    "include_mem=true",
    "include_clients=false&include_mem=false",
    "topic=t",
    "topic=p",
    "topic=nope",
    "topic=t&channel=c",
    "topic=t&channel=nope",
    "channel=c",
    "channel=pc",
    "channel=nope",
    "topic=&channel=",
    "topic=t&topic=p",
]


def _producers_sorted(doc: Any) -> Any:
    # nsqd lists its producers in the order of a Go map: by client id here.
    if doc.get("producers"):
        doc["producers"].sort(key=lambda p: p["client_id"])
    return doc


@pytest.mark.parametrize("query", FILTERS, ids=lambda q: q or "all")
async def test_json(conformance: Conformance, query: str) -> None:
    async def scenario(t: Target) -> Any:
        await build_state(t)
        async with t.http() as http:
            r = await http.get(f"/stats?format=json&{query}")
            return r.status_code, r.headers["content-type"], _producers_sorted(r.json())

    await conformance.nsqd(scenario, normalize=_memory_by_type)


@pytest.mark.parametrize(
    "query",
    ["", "include_mem=false", "include_clients=false", "topic=t", "topic=nope", "format=text"],
    ids=lambda q: q or "all",
)
async def test_text(conformance: Conformance, query: str) -> None:
    async def scenario(t: Target) -> Any:
        await build_state(t)
        async with t.http() as http:
            r = await http.get(f"/stats?{query}")
            return (
                r.status_code,
                r.headers["content-type"],
                _producers_in_order(mask_text_stats(r.text)),
            )

    await conformance.nsqd(scenario)


async def test_empty_node(conformance: Conformance) -> None:
    """No topic, no client: the nulls and empty lists, in both formats."""

    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            doc = (await http.get("/stats?format=json")).json()
            text = mask_text_stats((await http.get("/stats")).text)
            return doc, text

    await conformance.nsqd(scenario, normalize=_memory_by_type)


def _producers_in_order(text: str) -> str:
    # The text's producer lines, in a Go map's order: sorted here.
    head, sep, tail = text.partition("\nProducers:\n")
    if not sep:
        return text
    lines = tail.split("\n")
    producers = sorted(line for line in lines if line.startswith("   ["))
    rest = [line for line in lines if not line.startswith("   [")]
    return head + sep + "\n".join(producers + rest)


def _percentile_values(n: Normalizer) -> None:
    _memory_by_type(n)
    # A latency varies run to run: its presence and type are compared.
    n.key_rules["value"] = type_only


@pytest.mark.parametrize(
    "flags",
    [
        ("--e2e-processing-latency-percentile=0.99,0.5",),
        ("--e2e-processing-latency-percentile=1.0", "--e2e-processing-latency-percentile=0.95"),
    ],
    ids=lambda f: " ".join(f),
)
async def test_e2e_processing_latency(conformance: Conformance, flags: tuple[str, ...]) -> None:
    """With percentiles configured: the topic's and channels' e2e documents
    (count, quantiles in nsqd's order) once messages were finished."""

    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.identify()
        await c.sub("t", "c", rdy=10)
        async with t.http() as http:
            await http.post("/channel/create?topic=t&channel=idle")
            await http.post("/mpub?topic=t", content=b"a\nb\nc")
        for message in await c.read_messages(3):
            await c.send(cmds.fin(message.id))
        await c.sync()
        doc = await t.stats()
        return [
            (
                topic["topic_name"],
                topic["e2e_processing_latency"],
                [(ch["channel_name"], ch["e2e_processing_latency"]) for ch in topic["channels"]],
            )
            for topic in doc["topics"]
        ]

    await conformance.nsqd(scenario, *flags, normalize=_percentile_values)
