"""Differential conformance: each scenario runs on fakensq and on real NSQ v1.3.0.

In the manner of fakeredis, a scenario is written once, as an async function of a
:class:`Target` (the daemon's addresses, and helpers to talk to it).  The
``conformance`` fixture starts fakensq's daemon and the real one with the same
Go-style flags (fakensq parses them with its own nsqd/nsqlookupd flag sets, so
a flag fakensq lacks fails loudly), runs the scenario on each, normalizes both
outcomes (:mod:`.normalize`: message ids, ports, addresses, hostname, times) and
asserts they are equal, JSON key order included.  The real binaries come from
``tests/reference.py`` (``NSQ_BIN``, else ``shared/reference/nsq-bin`` above the
checkout); without them the scenario still runs on fakensq (its own asserts and
``expect=`` apply) and the test then skips, saying why.

Writing a scenario::

    async def test_rdy_out_of_range(conformance: Conformance) -> None:
        async def scenario(t: Target) -> None:
            c = await t.connect()            # a Session named "c" (magic sent)
            await c.sub("t", "ch")           # records ("c", "OK")
            await c.send(cmds.rdy(11))
            await c.read_until_closed()      # the error, then ("c", "closed")

        await conformance.nsqd(
            scenario,
            "--max-rdy-count=10",            # the same flags for both daemons
            expect=[("c", "OK"), ("c", "E_INVALID RDY count 11 out of range 0-10"),
                    ("c", "closed")],
        )

- The outcome is the target's transcript (everything every session read, in
  order: :mod:`.session`), or, if the scenario returns something, the pair
  ``(transcript, returned)``.  Return what the comparison should cover: HTTP
  status codes and bodies, ``/stats`` documents, message bodies...
- Never sleep: read a known number of frames (``read(n)``), read until the server
  closes (``read_until_closed()``), or use ``sync()`` (``PUB sync`` and its
  ``OK``) as a sync point; every read is bounded by ``trio.fail_after``.
  Poll HTTP state with :meth:`Target.until` when it changes asynchronously.
- Messages nsqd pushes on its own (deliveries, heartbeats) race with answers to
  later commands only where nsqd itself races; read them by count.
- Scenarios must not look at ``t.kind`` to behave differently; ``t.fake`` (the
  in-process :class:`fakensq.NSQD`, None on the real side) is only for extra
  checks of fakensq's internals.
- HTTP: ``async with t.http() as http: r = await http.get("/stats?format=json")``
  (an ``httpx.AsyncClient`` on the nsqd's HTTP address); return
  ``(r.status_code, r.json())`` or what matters.  Add normalization for new
  varying keys with ``normalize=lambda n: n.key_rules.update(...)``.
- nsqlookupd: ``await conformance.nsqlookupd(scenario, *flags)``; an nsqd
  registered with an nsqlookupd of the same kind: ``conformance.nsqd(scenario,
  *flags, lookupd=[lookupd flags])``, the lookupd is then ``t.lookupd``.
- AUTH: the ``auth_server`` fixture is one small HTTP auth server both daemons
  ask (``--auth-http-address=`` + ``auth_server.address``;
  :mod:`tests.support.authserver`).
"""

from __future__ import annotations

import difflib
import pprint
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from .. import reference
from ..support.authserver import AuthServer, running_auth_server
from ..support.nodes import Daemons, Node, open_daemons
from ..support.ports import free_address
from ..support.waiting import poll_until
from .normalize import Normalizer, key_order
from .session import READ_TIMEOUT, Session, Transcript

__all__ = ["AuthServer", "Conformance", "Target"]

#: A whole scenario's bound (each read has its own, shorter one).
SCENARIO_TIMEOUT = 60.0

_UNSET: Any = object()

#: One TLS context for every HTTP client (httpx builds one per client
#: otherwise, loading the CA bundle: 10-150 ms each, on every /stats read).
_TLS_CONTEXT = ssl.create_default_context()


@dataclass
class Target:
    """A daemon under test: ``kind`` is ``"fakensq"`` or ``"real"``."""

    kind: str
    tcp_address: str
    http_address: str
    normalizer: Normalizer
    transcript: Transcript = field(default_factory=Transcript)
    #: The nsqlookupd this nsqd registers with (``lookupd=`` given), same kind.
    lookupd: Target | None = None
    #: fakensq's in-process node (None for the real daemon): extra checks only.
    fake: Any = None
    #: A folder of this run's own (certificates, files...).
    tmp: Path = Path(".")
    #: The HTTPS address (nsqd with a TLS certificate), else "".
    https_address: str = ""
    #: Every session opened on this target, in order.
    sessions: list[Session] = field(default_factory=list)

    async def connect(self, name: str = "", *, magic: bool = True) -> Session:
        """A new TCP connection (its frames recorded under ``name``; by default
        ``c``, ``c2``, ``c3``... in order of connection)."""
        n = len(self.sessions) + 1
        if not name:
            name = "c" if n == 1 else f"c{n}"
        session = await Session.connect(
            self.tcp_address, name, self.transcript, self.normalizer, magic=magic
        )
        self.sessions.append(session)
        return session

    def http(self, **kwargs: Any) -> httpx.AsyncClient:
        """An HTTP client on this daemon's HTTP address (paths are relative)."""
        kwargs.setdefault("timeout", READ_TIMEOUT)
        kwargs.setdefault("verify", _TLS_CONTEXT)
        return httpx.AsyncClient(base_url=f"http://{self.http_address}", **kwargs)

    async def until(self, path: str, ok: Callable[[httpx.Response], bool]) -> httpx.Response:
        """GET ``path`` until ``ok(response)`` (state that changes asynchronously,
        as a registration with nsqlookupd or a message timing out), for at most
        :data:`tests.support.waiting.LIMIT` seconds."""
        async with self.http() as http:
            return await poll_until(lambda: http.get(path), ok, f"GET {path} to answer as wanted")

    async def stats(self, **params: str) -> Any:
        """``/stats?format=json`` (with ``params``), parsed (over HTTPS when nsqd
        requires TLS for HTTP too)."""
        query = {"format": "json", **params}
        async with self.http() as http:
            r = await http.get("/stats", params=query)
        if r.status_code == 403 and self.https_address and b"TLS_REQUIRED" in r.content:
            base = f"https://{self.https_address}"
            async with httpx.AsyncClient(base_url=base, verify=False, timeout=READ_TIMEOUT) as h:
                r = await h.get("/stats", params=query)
        r.raise_for_status()
        return r.json()


Scenario = Callable[[Target], Awaitable[Any]]


def _alias_daemon(normalizer: Normalizer, role: str, tcp: str, http: str) -> None:
    normalizer.alias(tcp, f"<{role}:tcp>")
    normalizer.alias(http, f"<{role}:http>")
    normalizer.alias(int(tcp.rpartition(":")[2]), f"<{role}:tcp_port>")
    normalizer.alias(int(http.rpartition(":")[2]), f"<{role}:http_port>")


@asynccontextmanager
async def _started(
    daemons: Daemons, name: str, flags: Sequence[str], normalizer: Normalizer
) -> AsyncIterator[Target]:
    """A node (``name``: ``"nsqd"`` or ``"nsqlookupd"``) of ``daemons``' kind,
    as a Target whose addresses ``normalizer`` knows; a real daemon's log is
    added to what fails while it runs."""
    node: Node
    if name == "nsqd":
        node = await daemons.nsqd(*flags)
    else:
        node = await daemons.nsqlookupd(*flags)
    role = "nsqd" if name == "nsqd" else "lookupd"
    _alias_daemon(normalizer, role, node.tcp_address, node.http_address)
    try:
        yield Target(node.kind, node.tcp_address, node.http_address, normalizer, fake=node.fake)
    except BaseException as exc:
        if node.real is not None:
            exc.add_note(f"real {name} log ({node.real.log_path}):\n{node.log()[-3000:]}")
        raise


class Conformance:
    """Runs scenarios on fakensq and on the real daemons, and compares (module doc)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self._runs = 0
        #: Why the comparison was skipped (pytest-trio loses a skip's reason).
        self.skip_reason = ""
        self._lookupd_kind: str | None = None

    @property
    def have_real(self) -> bool:
        return reference.binary("nsqd") is not None

    async def nsqd(
        self,
        scenario: Scenario,
        *flags: str,
        lookupd: Sequence[str] | None = None,
        lookupd_kind: str | None = None,
        expect: Any = _UNSET,
        normalize: Callable[[Normalizer], None] | None = None,
        parallel: bool = False,
    ) -> Any:
        """Run ``scenario`` against an nsqd started with ``flags`` (and, with
        ``lookupd`` flags, registered with an nsqlookupd of the same kind, or of
        ``lookupd_kind`` for both runs): fakensq's, then the real one; returns
        the normalized outcome.

        ``parallel=True`` runs both at once (for scenarios that wait out
        nsqd's timers; they must not share state, such as the auth server's
        list of queries).
        """
        self._lookupd_kind = lookupd_kind
        return await self._compare("nsqd", scenario, flags, lookupd, expect, normalize, parallel)

    async def nsqlookupd(
        self,
        scenario: Scenario,
        *flags: str,
        expect: Any = _UNSET,
        normalize: Callable[[Normalizer], None] | None = None,
    ) -> Any:
        """Run ``scenario`` against an nsqlookupd started with ``flags``."""
        return await self._compare("nsqlookupd", scenario, flags, None, expect, normalize, False)

    async def fakensq_only(
        self,
        name: str,
        scenario: Scenario,
        *flags: str,
        lookupd: Sequence[str] | None = None,
        normalize: Callable[[Normalizer], None] | None = None,
    ) -> Any:
        """Run ``scenario`` on fakensq's ``name`` (``"nsqd"``/``"nsqlookupd"``)
        alone (with ``lookupd`` flags, registered with fakensq's nsqlookupd),
        normalized as :meth:`nsqd` does: for fakensq-only options, whose outcome
        a test compares with another comparison's."""
        self._lookupd_kind = "fakensq"
        return await self._run("fakensq", name, scenario, flags, lookupd, normalize)

    async def _compare(
        self,
        name: str,
        scenario: Scenario,
        flags: Sequence[str],
        lookupd: Sequence[str] | None,
        expect: Any,
        normalize: Callable[[Normalizer], None] | None,
        parallel: bool,
    ) -> Any:
        binary = reference.binary(name)
        if self._lookupd_kind == "real" and reference.binary("nsqlookupd") is None:
            # Even fakensq's run needs the real nsqlookupd here: nothing to run.
            self.skip_reason = f"needs the real nsqlookupd: {reference.skip_reason()}"
            pytest.skip(self.skip_reason)
        need_lookupd = lookupd is not None and self._lookupd_kind != "fakensq"
        have_real = binary is not None and not (
            need_lookupd and reference.binary("nsqlookupd") is None
        )
        if parallel and have_real:
            outcomes: dict[str, Any] = {}

            async def run(kind: str) -> None:
                outcomes[kind] = await self._run(kind, name, scenario, flags, lookupd, normalize)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "fakensq")
                nursery.start_soon(run, "real")
            fake, real = outcomes["fakensq"], outcomes["real"]
            if expect is not _UNSET and fake != expect:
                pytest.fail(
                    "fakensq's outcome is not the expected one:\n"
                    + _diff(fake, expect, "expected"),
                    pytrace=False,
                )
            return self._check(fake, real)
        fake = await self._run("fakensq", name, scenario, flags, lookupd, normalize)
        if expect is not _UNSET and fake != expect:
            pytest.fail(
                "fakensq's outcome is not the expected one:\n" + _diff(fake, expect, "expected"),
                pytrace=False,
            )
        if not have_real:
            self.skip_reason = (
                f"fakensq ran it; no real {name} to compare with: {reference.skip_reason()}"
            )
            pytest.skip(self.skip_reason)
        real = await self._run("real", name, scenario, flags, lookupd, normalize)
        return self._check(fake, real)

    def _check(self, fake: Any, real: Any) -> Any:
        if fake != real:
            pytest.fail("fakensq and the real daemon differ:\n" + _diff(fake, real), pytrace=False)
        if key_order(fake) != key_order(real):
            pytest.fail(
                "same values, JSON keys in another order:\n"
                + _diff(key_order(fake), key_order(real)),
                pytrace=False,
            )
        return fake

    async def _run(
        self,
        kind: str,
        name: str,
        scenario: Scenario,
        flags: Sequence[str],
        lookupd_flags: Sequence[str] | None,
        normalize: Callable[[Normalizer], None] | None,
    ) -> Any:
        self._runs += 1
        tmp = self.tmp_path / f"{kind}-{self._runs}"
        tmp.mkdir()
        normalizer = Normalizer()
        if normalize is not None:
            normalize(normalizer)
        async with AsyncExitStack() as stack:
            lookupd: Target | None = None
            if lookupd_flags is not None:
                lookupd_kind = self._lookupd_kind or kind
                lookupds = await stack.enter_async_context(
                    open_daemons(lookupd_kind, tmp / "lookupd")
                )
                lookupd = await stack.enter_async_context(
                    _started(lookupds, "nsqlookupd", lookupd_flags, normalizer)
                )
                flags = [*flags, f"--lookupd-tcp-address={lookupd.tcp_address}"]
            https = ""
            if name == "nsqd" and any(f.lstrip("-").startswith("tls-cert") for f in flags):
                # With a certificate nsqd also serves HTTPS, by default on the
                # fixed port 4152: give it a free one.
                https = free_address()
                normalizer.alias(https, "<nsqd:https>")
                normalizer.alias(int(https.rpartition(":")[2]), "<nsqd:https_port>")
                flags = [*flags, f"--https-address={https}"]
            daemons = await stack.enter_async_context(open_daemons(kind, tmp / "daemons"))
            target = await stack.enter_async_context(_started(daemons, name, flags, normalizer))
            target.lookupd = lookupd
            target.tmp = tmp
            target.https_address = https
            target.transcript = Transcript()
            try:
                with trio.fail_after(SCENARIO_TIMEOUT):
                    returned = await scenario(target)
            except BaseException as exc:
                exc.add_note(f"the scenario failed on {kind}; transcript so far:")
                exc.add_note("\n".join(repr(e) for e in normalizer(target.transcript)))
                raise
        transcript = list(target.transcript)
        outcome = transcript if returned is None else (transcript, returned)
        return normalizer(outcome)


def _diff(left: Any, right: Any, right_name: str = "real") -> str:
    lines = difflib.unified_diff(
        pprint.pformat(left, width=100).splitlines(),
        pprint.pformat(right, width=100).splitlines(),
        "fakensq",
        right_name,
        lineterm="",
        n=6,
    )
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    # pytest-trio re-raises a skip from inside the test's nursery without its
    # reason: put the reason back, so that ``-rs`` says why.
    fixture = getattr(item, "funcargs", {}).get("conformance")
    if report.skipped and isinstance(fixture, Conformance) and fixture.skip_reason:
        path, line, _ = report.location
        report.longrepr = (path, (line or 0) + 1, f"Skipped: {fixture.skip_reason}")
    return report


@pytest.fixture
def conformance(tmp_path: Path) -> Conformance:
    """Runs a scenario on fakensq and on the real daemon, and compares."""
    return Conformance(tmp_path)


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    """An auth server on a free loopback port (``auth_server.address``), for
    both daemons: its ``grants`` are set by the test."""
    with running_auth_server() as server:
        yield server
