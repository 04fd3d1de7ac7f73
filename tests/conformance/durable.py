"""fakensq's nsqd and the real one side by side, for the durability tests
(``test_durability``, ``test_durability_cases``): the same actions on both,
what each holds read back from ``/stats``, and stops and kills that leave
nothing to chance (the module doc of ``test_durability`` says why each
wait is there)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio

from trionsq.protocol import commands as cmds
from trionsq.protocol.names import is_ephemeral

from ..support.nodes import Nsqd
from ..support.waiting import poll
from .normalize import Normalizer
from .session import READ_TIMEOUT, Session, Transcript

__all__ = ["Daemon", "Run", "view", "SENTINEL", "DEFER_MS"]

T = TypeVar("T")

#: Never touched by the scenarios: unpaused before each kill, so that the
#: real nsqd's nsqd.dat is written from the state it ended with.
SENTINEL = "sentinel"
#: A DPUB delay that never comes due during a run.
DEFER_MS = 3_600_000
#: A message id no nsqd gives out.
NO_ID = b"0123456789abcdef"
#: How long a publish waits for the topic's pump to hand on what came before.
PUMP_TIMEOUT = 2.0
#: How long the real nsqd gets to reach what fakensq holds after a step.
SETTLE_TIMEOUT = 5.0


def view(stats: Any) -> list[Any]:
    """The part of ``/stats`` the model states."""
    return sorted(
        (
            t["topic_name"],
            t["paused"],
            t["depth"],
            t["backend_depth"],
            sorted(
                (
                    c["channel_name"],
                    c["paused"],
                    c["depth"],
                    c["backend_depth"],
                    c["in_flight_count"],
                    c["deferred_count"],
                )
                for c in t["channels"]
            ),
        )
        for t in stats["topics"] or []
    )


class Daemon:
    """One nsqd under test (fakensq's or the real one), restartable."""

    def __init__(self, kind: str, data: Path, flags: list[str], nursery: trio.Nursery) -> None:
        self.node = Nsqd(kind, flags, data, nursery)
        self.data = data

    @property
    def base(self) -> str:
        return f"http://{self.node.http_address}"

    async def post(self, http: httpx.AsyncClient, path: str) -> tuple[int, str]:
        r = await http.post(self.base + path)
        return r.status_code, r.text

    async def stats(self, http: httpx.AsyncClient) -> Any:
        r = await http.get(self.base + "/stats?format=json")
        r.raise_for_status()
        return r.json()

    async def publish(
        self, topic: str, bodies: list[bytes], how: str, http: httpx.AsyncClient | None = None
    ) -> list[Any]:
        """Publish ``bodies`` by MPUB, or one PUB or DPUB at a time; with ``http``,
        each of these once the topic's pump has handed on what came before.

        (nsqd's topic puts a message in its memory queue only if that has room
        right then, and with ``--mem-queue-size=0`` only if the pump waits on it:
        else to disk, where a DPUB's delay is lost.  A publish that comes while
        the pump still hands on the one before finds no room by chance: on a busy
        machine nsqd's pump may not have run yet.)"""
        s = await Session.connect(self.node.tcp_address, "p", Transcript(), Normalizer())
        try:
            if how == "mpub":
                return await s.call(cmds.mpub(topic, bodies))
            out = []
            for body in bodies:
                if http is not None:
                    await self._pump_idle(http, topic)
                if how == "dpub":
                    out += await s.call(cmds.dpub(topic, DEFER_MS, body))
                else:
                    out += await s.call(cmds.pub(topic, body))
            return out
        finally:
            await s.close()

    async def _pump_idle(self, http: httpx.AsyncClient, topic: str) -> None:
        """Until the topic's queue is empty, where its pump runs (it has
        channels and is not paused); bounded."""

        async def read() -> Any:
            found = [t for t in (await self.stats(http))["topics"] or [] if t["topic_name"] == topic]
            return found[0] if found else None

        def idle(t: Any) -> bool:
            return t is None or t["paused"] or not t["channels"] or t["depth"] == 0

        await poll(read, idle, limit=PUMP_TIMEOUT)

    async def hold(self, topic: str, channel: str, n: int) -> list[bytes]:
        """Take ``n`` messages of the channel with a consumer that leaves
        without finishing them (they stay in flight); sorted."""
        s = await Session.connect(self.node.tcp_address, "c", Transcript(), Normalizer())
        try:
            await s.sub(topic, channel, rdy=n)
            with trio.fail_after(READ_TIMEOUT):
                msgs = await s.read_messages(n)
            await s.send(cmds.rdy(0), cmds.touch(NO_ID))  # (the TOUCH: a sync point)
            with trio.fail_after(READ_TIMEOUT):
                (answer,) = await s.read(1)
            assert str(answer[1]).startswith("E_TOUCH_FAILED"), answer
            return sorted(m.body for m in msgs)
        finally:
            await s.close()

    async def drain(self, topic: str, channel: str, n: int) -> list[bytes]:
        """Read ``n`` messages of the channel with a consumer, FIN each (after
        RDY 0: none more comes, even if the channel holds more); sorted."""
        s = await Session.connect(self.node.tcp_address, "c", Transcript(), Normalizer())
        try:
            await s.sub(topic, channel, rdy=n)
            with trio.fail_after(READ_TIMEOUT):
                msgs = await s.read_messages(n)
            # FINs are answered only when they fail: a TOUCH of an id never
            # given out fails (and changes nothing), its error comes after them.
            await s.send(cmds.rdy(0), *(cmds.fin(m.id) for m in msgs), cmds.touch(NO_ID))
            with trio.fail_after(READ_TIMEOUT):
                (answer,) = await s.read(1)
            assert str(answer[1]).startswith("E_TOUCH_FAILED"), answer
            return sorted(m.body for m in msgs)
        finally:
            await s.close()

    def synced_depths(self, stats: Any) -> dict[str, tuple[int, int]]:
        """Each disk queue's backend depth in ``stats`` and in its meta file
        (0 without one)."""
        out = {}
        for t in stats["topics"] or []:
            names = [(t["topic_name"], t["backend_depth"])]
            names += [
                (f"{t['topic_name']}:{c['channel_name']}", c["backend_depth"])
                for c in t["channels"]
            ]
            for name, depth in names:
                if is_ephemeral(name):
                    continue
                try:
                    text = (self.data / f"{name}.diskqueue.meta.dat").read_text()
                    synced = int(text.split("\n")[0])
                except FileNotFoundError:
                    synced = 0
                out[name] = (depth, synced)
        return out


class Run:
    """fakensq and (if there is one) the real nsqd, with the same flags; every
    action goes to both, fakensq first."""

    def __init__(self, nursery: trio.Nursery, folder: Path, flags: list[str], real: bool) -> None:
        self.nursery = nursery
        self.fake = Daemon("fakensq", folder / "fakensq", flags, nursery)
        self.real = Daemon("real", folder / "real", flags, nursery) if real else None
        self.http = httpx.AsyncClient(timeout=READ_TIMEOUT)

    @property
    def daemons(self) -> list[Daemon]:
        return [self.fake] if self.real is None else [self.fake, self.real]

    async def start(self) -> None:
        for d in self.daemons:
            await trio.Path(d.data).mkdir(parents=True)
            await d.node.start()
            await d.post(self.http, f"/topic/create?topic={SENTINEL}")

    async def close(self) -> None:
        for d in self.daemons:
            await d.node.close()
        await self.http.aclose()

    async def publish(self, topic: str, bodies: list[bytes], how: str) -> list[list[Any]]:
        """Each daemon's answers to publishing ``bodies`` (see :meth:`Daemon.publish`)."""
        return await self.each(lambda d: d.publish(topic, bodies, how, self.http))

    async def each(self, action: Callable[[Daemon], Awaitable[T]]) -> list[T]:
        return [await action(d) for d in self.daemons]

    async def hold(self, topic: str, channel: str, n: int) -> list[list[bytes]]:
        """What a consumer that leaves holding ``n`` messages took on each daemon."""
        return await self.each(lambda d: d.hold(topic, channel, n))

    async def drain(self, topic: str, channel: str, n: int) -> list[list[bytes]]:
        """What a consumer of the channel reads from each daemon (``n`` each)."""
        return await self.each(lambda d: d.drain(topic, channel, n))

    async def settle(self) -> list[Any]:
        """fakensq's view, and the real nsqd's once it holds the same (or
        after SETTLE_TIMEOUT)."""
        fake = view(await self.fake.stats(self.http))
        if self.real is None:
            return [fake]
        real = self.real

        async def read() -> Any:
            return view(await real.stats(self.http))

        return [fake, await poll(read, lambda v: v == fake, limit=SETTLE_TIMEOUT)]

    async def stop(self, *, kill: bool) -> None:
        for d in self.daemons:
            if kill:
                await d.post(self.http, f"/topic/unpause?topic={SENTINEL}")
                await self._wait_synced(d)
            await d.node.stop(kill=kill)
            await d.node.start()

    async def _wait_synced(self, d: Daemon) -> None:
        async def read() -> dict[str, tuple[int, int]]:
            return d.synced_depths(await d.stats(self.http))

        depths = await poll(read, lambda v: all(a == b for a, b in v.values()), limit=READ_TIMEOUT)
        assert all(a == b for a, b in depths.values()), f"{d.node.kind}: not synced: {depths}"
