"""An nsqd's registration with nsqlookupd, compared between fakensq and NSQ v1.3.0,
both ways: each scenario runs with an nsqd and an nsqlookupd of the same kind
(fakensq's pair against the real pair), with fakensq's nsqlookupd under both
nsqds, and with the real nsqlookupd under both.  What nsqlookupd shows (topics,
channels, producers, nodes, tombstones, /debug) is compared after each step:
topics and channels created and deleted, ephemeral ones going with their last
consumer, channels pre-created from nsqlookupd, the nsqd leaving and coming back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from trionsq.protocol import commands as cmds

from ..support.waiting import poll_until
from .conftest import Conformance, Target
from .httpcheck import unsettled
from .lookupd import debug_times, lookupd_state
from .normalize import Normalizer

KINDS = [None, "fakensq", "real"]
KIND_IDS = ["same kinds", "fakensq lookupd", "real lookupd"]


def _normalize(n: Normalizer) -> None:
    debug_times(n)
    # The nsqd's own end of its connection to nsqlookupd: a port of its choosing.
    n.key_rules["remote_address"] = lambda v: "<nsqd's address>"
    n.key_rules["id"] = lambda v: "<nsqd's address>"


async def _until(t: Target, path: str, ok: Callable[[Any], bool]) -> None:
    """Wait until nsqlookupd's ``path`` shows what ``ok`` wants (registration
    travels on another connection, asynchronously)."""
    assert t.lookupd is not None

    def check(r: httpx.Response) -> bool:
        try:
            return ok(r.json())
        except (ValueError, KeyError):
            return False

    await t.lookupd.until(path, check)


async def _lookupd(t: Target, *topics: str) -> dict[str, Any]:
    assert t.lookupd is not None
    return await lookupd_state(t.lookupd, *topics)


def _channels(*names: str) -> Callable[[Any], bool]:
    return lambda doc: sorted(doc.get("channels") or []) == sorted(names)


def _producers(n: int) -> Callable[[Any], bool]:
    return lambda doc: len(doc.get("producers") or []) == n


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
async def test_topics_and_channels_come_and_go(conformance: Conformance, kind: str | None) -> None:
    async def scenario(t: Target) -> Any:
        steps = []
        await _until(t, "/nodes", _producers(1))  # the nsqd identified itself
        steps.append(await _lookupd(t, "a"))
        async with t.http() as http:
            await http.post("/topic/create?topic=a")
            await http.post("/channel/create?topic=a&channel=c1")
            await http.post("/channel/create?topic=a&channel=c2")
            await http.post("/topic/create?topic=b")
            await _until(t, "/channels?topic=a", _channels("c1", "c2"))
            await _until(t, "/lookup?topic=b", _producers(1))
            steps.append(await _lookupd(t, "a", "b"))
            await http.post("/channel/delete?topic=a&channel=c2")
            # The producer leaves the channel; the registration stays (a
            # non-ephemeral channel's does, in nsqlookupd).
            await _until(t, "/debug", lambda doc: "channel:a:c2:" not in doc)
            steps.append(await _lookupd(t, "a", "b"))
            await http.post("/topic/delete?topic=b")
            await _until(t, "/lookup?topic=b", _producers(0))
            steps.append(await _lookupd(t, "a", "b"))
            await http.post("/topic/delete?topic=a")
            await _until(t, "/lookup?topic=a", _producers(0))
            steps.append(await _lookupd(t, "a", "b"))
        return steps

    await conformance.nsqd(scenario, lookupd=[], lookupd_kind=kind, normalize=_normalize)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
async def test_ephemeral_channel_and_topic(conformance: Conformance, kind: str | None) -> None:
    """Ephemeral channels (and an ephemeral topic) register with their first
    consumer and leave nsqlookupd, registration and all, with their last."""

    async def scenario(t: Target) -> Any:
        steps = []
        c = await t.connect()
        await c.identify()
        await c.sub("t", "c#ephemeral")
        e = await t.connect()
        await e.identify()
        await e.sub("e#ephemeral", "c#ephemeral")
        k = await t.connect()
        await k.identify()
        await k.sub("k#ephemeral", "kept")  # a durable channel keeps its topic
        await _until(t, "/channels?topic=t", _channels("c#ephemeral"))
        await _until(t, "/channels?topic=e%23ephemeral", _channels("c#ephemeral"))
        await _until(t, "/channels?topic=k%23ephemeral", _channels("kept"))
        steps.append(await _lookupd(t, "t", "e#ephemeral", "k#ephemeral"))
        await c.close()
        await e.close()
        await k.close()
        await _until(t, "/channels?topic=t", _channels())
        await _until(t, "/topics", lambda doc: "e#ephemeral" not in doc["topics"])
        await _until(t, "/debug", lambda doc: "channel:k#ephemeral:kept" in doc)
        steps.append(await _lookupd(t, "t", "e#ephemeral", "k#ephemeral"))
        return steps

    await conformance.nsqd(scenario, lookupd=[], lookupd_kind=kind, normalize=_normalize)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
async def test_channels_pre_created_from_lookupd(
    conformance: Conformance, kind: str | None
) -> None:
    """A new topic asks nsqlookupd which channels it has elsewhere and creates
    them first (not ephemeral ones), so they get what is published."""

    async def scenario(t: Target) -> Any:
        assert t.lookupd is not None
        await _until(t, "/nodes", _producers(1))
        async with t.lookupd.http() as http:
            await http.post("/channel/create?topic=t&channel=known")
            await http.post("/channel/create?topic=t&channel=gone%23ephemeral")
        async with t.http() as http:
            assert (await http.post("/pub?topic=t", content=b"x")).status_code == 200
        await _until(t, "/lookup?topic=t", _producers(1))
        stats = await t.until(
            "/stats?format=json&topic=t",
            lambda r: bool(r.json()["topics"]) and bool(r.json()["topics"][0]["channels"]),
        )
        topic = stats.json()["topics"][0]
        channels = [(ch["channel_name"], ch["depth"]) for ch in topic["channels"]]
        return channels, topic["depth"], await _lookupd(t, "t")

    await conformance.nsqd(scenario, lookupd=[], lookupd_kind=kind, normalize=_normalize)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
async def test_lookupd_addresses_changed_at_runtime(
    conformance: Conformance, kind: str | None
) -> None:
    """PUT /config/nsqlookupd_tcp_addresses: an nsqd dropped from the list
    leaves nsqlookupd; put back, it registers everything it has again."""

    async def scenario(t: Target) -> Any:
        assert t.lookupd is not None
        steps = []
        async with t.http() as http:
            await http.post("/topic/create?topic=t")
            await http.post("/channel/create?topic=t&channel=c")
            await http.post("/topic/create?topic=lonely")
            await _until(t, "/channels?topic=t", _channels("c"))
            await _until(t, "/lookup?topic=lonely", _producers(1))
            steps.append(await _lookupd(t, "t", "lonely"))
            r = await http.put("/config/nsqlookupd_tcp_addresses", content=b"[]")
            steps.append((r.status_code, r.json()))
            await _until(t, "/nodes", _producers(0))
            steps.append(await _lookupd(t, "t", "lonely"))
            body = f'["{t.lookupd.tcp_address}"]'.encode()
            r = await http.put("/config/nsqlookupd_tcp_addresses", content=body)
            steps.append(r.status_code)
            await _until(t, "/lookup?topic=lonely", _producers(1))
            await _until(t, "/lookup?topic=t", _producers(1))
            steps.append(await _lookupd(t, "t", "lonely"))
        return steps

    await conformance.nsqd(scenario, lookupd=[], lookupd_kind=kind, normalize=_normalize)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
async def test_tombstoned_nsqd(conformance: Conformance, kind: str | None) -> None:
    """Tombstoning an nsqd's topic hides it from /lookup of that topic (only);
    the nsqd then deleting the topic takes the tombstone with it."""

    async def scenario(t: Target) -> Any:
        assert t.lookupd is not None
        steps = []
        async with t.http() as http:
            await http.post("/topic/create?topic=t")
            await http.post("/topic/create?topic=other")
            await _until(t, "/lookup?topic=t", _producers(1))
            await _until(t, "/lookup?topic=other", _producers(1))
            node = f"127.0.0.1:{t.http_address.rpartition(':')[2]}"
            async with t.lookupd.http() as lookupd_http:
                r = await lookupd_http.post("/topic/tombstone", params={"topic": "t", "node": node})
                steps.append(r.status_code)
            steps.append(await _lookupd(t, "t", "other"))
            await http.post("/topic/delete?topic=t")
            await _until(t, "/lookup?topic=t", lambda doc: not doc["producers"])
            steps.append(await _lookupd(t, "t", "other"))
            await http.post("/topic/create?topic=t")
            await _until(t, "/lookup?topic=t", _producers(1))
            steps.append(await _lookupd(t, "t", "other"))
        return steps

    await conformance.nsqd(scenario, lookupd=[], lookupd_kind=kind, normalize=_normalize)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
async def test_broadcast_flags_reach_lookupd(conformance: Conformance, kind: str | None) -> None:
    """--broadcast-address/--broadcast-tcp-port/--broadcast-http-port are what
    the nsqd tells nsqlookupd (and what readers then dial)."""

    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            await http.post("/topic/create?topic=t")
        await _until(t, "/lookup?topic=t", _producers(1))
        return await _lookupd(t, "t")

    await conformance.nsqd(
        scenario,
        "--broadcast-address=nsqd.example",
        "--broadcast-tcp-port=1234",
        "--broadcast-http-port=2345",
        lookupd=[],
        lookupd_kind=kind,
        normalize=_normalize,
    )


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("how", ["PUB", "MPUB", "DPUB", "/pub", "/mpub", "/topic/create", "SUB"])
async def test_channels_pre_created_before_the_answer(
    conformance: Conformance, kind: str | None, how: str
) -> None:
    """nsqd's GetTopic asks nsqlookupd for a new topic's channels and creates
    them before it returns: when the OK of the command (or request) that made
    the topic arrives, /stats already shows the channel another nsqd
    registered.  No waiting for the channel: /stats is read at once, and again
    only while the topic's pump (its own goroutine in nsqd) has yet to move the
    message into the channels that are already there."""

    async def scenario(t: Target) -> Any:
        assert t.lookupd is not None
        # nsqd asks only the nsqlookupds whose IDENTIFY answer it has read (it
        # learns their HTTP port from it), which /nodes showing this nsqd does
        # not prove: a topic it then registers does (nsqd registers only once
        # that answer is read).  On a loaded machine the real nsqd was seen
        # still waiting for it.
        async with t.http() as http:
            await http.post("/topic/create?topic=ready")
        await _until(t, "/lookup?topic=ready", _producers(1))
        async with t.lookupd.http() as http:
            # What another nsqd's channel registration leaves in nsqlookupd.
            await http.post("/channel/create?topic=t&channel=elsewhere")
        answers: list[Any] = []
        async with t.http() as http:
            if how.startswith("/"):
                body = b"x\ny" if how == "/mpub" else b"x"
                r = await http.post(f"{how}?topic=t", content=b"" if "create" in how else body)
                answers.append((r.status_code, r.text))
            else:
                c = await t.connect()
                if how == "PUB":
                    answers.append(await c.call(cmds.pub("t", b"x")))
                elif how == "MPUB":
                    answers.append(await c.call(cmds.mpub("t", [b"x", b"y"])))
                elif how == "DPUB":
                    answers.append(await c.call(cmds.dpub("t", 60_000, b"x")))
                else:
                    await c.identify()
                    answers.append(await c.sub("t", "mine"))

            async def read() -> Any:
                return (await http.get("/stats?format=json&topic=t")).json()

            stats = await poll_until(
                read, lambda s: not unsettled(s["topics"][0]), "topic t's pump to settle"
            )
        topic = stats["topics"][0]
        channels = [
            (ch["channel_name"], ch["depth"], ch["deferred_count"]) for ch in topic["channels"]
        ]
        return answers, channels, topic["depth"]

    await conformance.nsqd(scenario, lookupd=[], lookupd_kind=kind, normalize=_normalize)
