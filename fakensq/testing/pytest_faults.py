"""``pytest --nsq-faults=SEED``: every test using fakensq's fixtures meets faults.

The pytest plugin (:mod:`fakensq.pytest_plugin`) takes its options and hooks
from here.  With ``--nsq-faults=SEED``, each fixture a test uses (``nsqd``,
``nsqd_factory``'s nodes, ``nsq_cluster``, ``sim_cluster``) plays a fault
schedule drawn from the seed, the test's node id and the fixture's label, so the
same seed and test always get the same schedule, whatever else runs.

Where the faults land:

- the TCP fixtures (``nsqd``, ``nsqd_factory``, ``nsq_cluster``), served in
  real time, place them by the test's own message flow
  (:mod:`fakensq.testing.flow`): "drop the consumer's connection at the 12th
  FIN", "time out what is in flight after the 7th message sent", "stall the
  answer to the publish of the 3rd message", counted per nsqd, so a replay meets
  them at the same points however fast the machine is; what lasts, lasts a
  multiple of the run's own timeouts.  Each schedule holds first a message
  lost on its way to the consumer, one handled whose FIN nsqd never reads, and
  a publish's answer held until the publisher publishes again: the three ways
  a fault reveals a consumer's or a publisher's bug, met by most tests.  Their
  nsqds get a ``msg_timeout`` of :data:`FAULTS_MSG_TIMEOUT` seconds (unless the
  test sets one), so that the messages a dropped consumer held come back
  within a test's patience;
- a ``sim_cluster`` (virtual time) keeps its schedules placed by the clock, over
  its first :data:`VIRTUAL_HORIZON` virtual seconds.

A failing test's report shows the faults it met (numbered, with the point of
the flow each was tied to and what it did), those it did not reach and why, and
the command line that replays that one test with the same schedule.
``--nsq-faults-only=nsqd-0:2,...`` keeps only the faults named;
``--nsq-faults-check`` runs each failing test again with its seed and says
whether it met the same faults and failed the same way;
``--nsq-faults-shrink`` searches the smallest set of the faults it met that
still fails it (:mod:`fakensq.testing.pytest_replay`).

Tuning: ``--nsq-faults-rate`` (the mean number of faults a fixture plays in a
test), ``--nsq-faults-level`` (``safe``, ``harsh``, ``lossy``: see
:mod:`fakensq.testing.schedule`), ``--nsq-faults-kinds`` (only these), and per test
``@pytest.mark.nsq_faults(rate=..., level=..., kinds=[...], horizon=...,
redeliveries=..., msg_timeout=..., enabled=False)`` (``horizon``: events of
the flow for the TCP fixtures, virtual seconds for a ``sim_cluster``).  Without
``--nsq-faults`` nothing changes and the marker does nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
import trio

from .faultplayer import FaultPlayer, MetFault, not_yet_met
from .flow import DEFAULT_HORIZON, FlowSchedule, draw_flow_schedule, format_only, parse_only
from .flowplayer import FlowPlayer, MetFlowFault
from .schedule import (
    DEFAULT_REDELIVERIES,
    KINDS,
    FaultSchedule,
    Level,
    draw_schedule,
    parse_kinds,
    parse_level,
    seed_for,
)

if TYPE_CHECKING:
    from ..nsqd.node import NSQD
    from .cluster import Cluster
    from .faults import Faults

__all__ = [
    "FAULTS_MSG_TIMEOUT",
    "FaultSettings",
    "TestFaults",
    "add_options",
    "faults_of",
    "report_section",
]

#: The TCP fixtures' nsqds' msg_timeout under ``--nsq-faults`` (seconds).
FAULTS_MSG_TIMEOUT: Final = 2.0
#: ... their memory queues (``--mem-queue-size``), the rest of what waits on
#: disk: see :meth:`TestFaults.tune_nsqd_options`.
FAULTS_MEM_QUEUE: Final = 4
#: ... and how often fakensq's nsqds look for new channels' timeouts (nsqd's
#: queue scan refresh: 5 s).
FAULTS_SCAN_REFRESH: Final = 0.25
#: Over how many seconds a sim_cluster's faults are spread, by default: in
#: virtual time (on a MockClock), and in real time (without one).
VIRTUAL_HORIZON: Final = 120.0
REAL_HORIZON: Final = 2.0
DEFAULT_RATE: Final = 4.0

MARKER: Final = (
    "nsq_faults(rate=, level=, kinds=, horizon=, redeliveries=, msg_timeout=, enabled=): "
    "tune the faults `pytest --nsq-faults=SEED` injects into this test's fakensq fixtures"
)
_MARKER_OPTIONS: Final = frozenset(
    {"rate", "level", "kinds", "horizon", "redeliveries", "msg_timeout", "enabled"}
)

_STASH: Final = pytest.StashKey["TestFaults"]()
_SETTINGS: Final = pytest.StashKey["FaultSettings | None"]()


def _seed(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise ValueError(f"--nsq-faults wants an integer seed, not {text!r}") from None
    if value < 0:
        raise ValueError(f"--nsq-faults wants a seed >= 0, not {value}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--nsq-faults-rate wants a number, not {text!r}") from None
    if not 0 <= value <= 1000:
        raise ValueError(f"--nsq-faults-rate wants a number from 0 to 1000, not {text}")
    return value


def add_options(parser: pytest.Parser) -> None:
    """The plugin's command-line options."""
    group = parser.getgroup("fakensq", "fakensq fault injection")
    group.addoption(
        "--nsq-faults",
        metavar="SEED",
        default=None,
        help="inject faults drawn from SEED (an integer) into every test using fakensq's "
        "fixtures; a failing test's report shows them and how to replay it",
    )
    group.addoption(
        "--nsq-faults-rate",
        metavar="N",
        default=None,
        help=f"mean number of faults a fixture meets in a test (default {DEFAULT_RATE:g})",
    )
    group.addoption(
        "--nsq-faults-level",
        metavar="LEVEL",
        default=None,
        help="safe (default: nothing a correct at-least-once consumer cannot survive, "
        "no publish refused), harsh (producers must retry too) or lossy (unclean kills)",
    )
    group.addoption(
        "--nsq-faults-kinds",
        metavar="KIND,...",
        default=None,
        help=f"only these fault kinds ({', '.join(KINDS)})",
    )
    group.addoption(
        "--nsq-faults-only",
        metavar="LABEL:N,...",
        default=None,
        help="keep only the faults named as a report numbers them (nsqd-0:2,nsqd-0:5), "
        "or none: replay a shrunk schedule",
    )
    group.addoption(
        "--nsq-faults-check",
        action="store_true",
        default=False,
        help="run each failing test again with the same seed and say whether it met the "
        "same faults and failed the same way",
    )
    group.addoption(
        "--nsq-faults-shrink",
        action="store_true",
        default=False,
        help="for each failing test, search the smallest set of the faults it met that "
        "still fails it (each candidate a replay) and print its replay command",
    )
    # Where a replay run (--nsq-faults-check, --nsq-faults-shrink) writes what
    # each test met and how it ended, for the run that started it.
    group.addoption("--nsq-faults-record", default=None, help=argparse.SUPPRESS)


@dataclass(frozen=True)
class FaultSettings:
    """What ``--nsq-faults*`` asked for (the session's defaults)."""

    seed: int
    rate: float = DEFAULT_RATE
    level: Level = "safe"
    kinds: tuple[str, ...] | None = None
    #: ``--nsq-faults-only``: the faults kept, by fixture label (None: all)
    only: Mapping[str, frozenset[int]] | None = None
    check: bool = False
    shrink: bool = False
    record: str | None = None

    @classmethod
    def from_config(cls, config: pytest.Config) -> FaultSettings | None:
        """The settings, or None without ``--nsq-faults``; ``pytest.UsageError``
        (one line) for a malformed value."""
        raw = config.getoption("--nsq-faults")
        rate = config.getoption("--nsq-faults-rate")
        level = config.getoption("--nsq-faults-level")
        kinds = config.getoption("--nsq-faults-kinds")
        only = config.getoption("--nsq-faults-only")
        check = bool(config.getoption("--nsq-faults-check"))
        shrink = bool(config.getoption("--nsq-faults-shrink"))
        try:
            if raw is None:
                if any(v is not None for v in (rate, level, kinds, only)) or check or shrink:
                    raise ValueError(
                        "--nsq-faults-rate/-level/-kinds/-only/-check/-shrink "
                        "need --nsq-faults=SEED"
                    )
                return None
            return cls(
                seed=_seed(raw),
                rate=DEFAULT_RATE if rate is None else _rate(rate),
                level=parse_level("safe" if level is None else level),
                kinds=None if kinds is None else parse_kinds(kinds.split(",")),
                only=None if only is None else parse_only(only),
                check=check,
                shrink=shrink,
                record=config.getoption("--nsq-faults-record"),
            )
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None

    def options(self, only: str | None = None) -> list[str]:
        """The command-line options that give these settings (``only``: a
        ``--nsq-faults-only`` value in place of the session's)."""
        out = [f"--nsq-faults={self.seed}"]
        if self.rate != DEFAULT_RATE:
            out.append(f"--nsq-faults-rate={self.rate:g}")
        if self.level != "safe":
            out.append(f"--nsq-faults-level={self.level}")
        if self.kinds is not None:
            out.append("--nsq-faults-kinds=" + ",".join(self.kinds))
        if only is None and self.only is not None:
            only = format_only((label, n) for label, ids in self.only.items() for n in ids)
        if only is not None:
            out.append(f"--nsq-faults-only={only}")
        return out


@dataclass
class TestFaults:
    """One test's faults: its seed, its settings (the session's, tuned by its
    marker) and what its fixtures' players did."""

    settings: FaultSettings
    nodeid: str
    rate: float
    level: Level
    kinds: tuple[str, ...] | None
    horizon: float | None
    redeliveries: int
    msg_timeout: float | None
    players: list[FaultPlayer] = field(default_factory=list)
    flows: list[FlowPlayer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: the flow schedules' fault numbers as drawn, by fixture label
    _drawn: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def seed(self) -> int:
        """The test's own seed (from the session's and the node id)."""
        return seed_for(self.settings.seed, self.nodeid)

    def tune_nsqd_options(self, options: dict[str, Any], *, real: bool = False) -> None:
        """The TCP fixtures' nsqd options under faults, where the test sets
        none: the messages a dropped consumer held come back within the
        test's patience (``msg_timeout``); fakensq looks at a new channel's
        timeouts from its next scan, not the next refresh 5 s on (a real nsqd
        has no flag for that: there they wait for it).

        And nsqd's order, not fakensq's oldest-first: a memory queue of
        :data:`FAULTS_MEM_QUEUE` messages (``--mem-queue-size``), the rest on
        disk, read as nsqd's select reads them (memory or disk at random,
        seeded by the test's seed: fakensq's ``select_order``), so a message
        that comes back (into memory) may go out before older ones still on
        disk, while the test still counts, as on a busy nsqd."""
        if self.msg_timeout is not None:
            options.setdefault("msg_timeout", self.msg_timeout)
        options.setdefault("mem_queue_size", FAULTS_MEM_QUEUE)
        if not real:
            options.setdefault("queue_scan_refresh_interval", FAULTS_SCAN_REFRESH)
            options.setdefault("select_order", True)
            options.setdefault("seed", self.seed)

    def schedule(self, label: str, *, nsqd: int, lookupd: int, virtual: bool) -> FaultSchedule:
        """The clock-placed schedule of the fixture ``label`` (a sim_cluster):
        the same for the same test, seed and label."""
        rng = random.Random(seed_for(self.seed, label))
        return draw_schedule(
            rng,
            rate=self.rate,
            horizon=self.horizon or (VIRTUAL_HORIZON if virtual else REAL_HORIZON),
            level=self.level,
            kinds=self.kinds,
            nsqd=nsqd,
            lookupd=lookupd,
            redeliveries=self.redeliveries,
        )

    def flow_schedule(
        self, label: str, *, nsqd: int, lookupd: int, real: bool = False, all: bool = False
    ) -> FlowSchedule:
        """The flow-placed schedule of the TCP fixture ``label``, less what
        ``--nsq-faults-only`` leaves out (``all``: as drawn)."""
        rng = random.Random(seed_for(self.seed, label))
        schedule = draw_flow_schedule(
            rng,
            rate=self.rate,
            level=self.level,
            kinds=self.kinds,
            nsqd=nsqd,
            lookupd=lookupd,
            # A real nsqd: the wire (its proxy) and restarts, not fakensq's insides.
            needs=("wire", "nodes") if real else ("wire", "nsqd", "nodes"),
            redeliveries=self.redeliveries,
            horizon=int(self.horizon or DEFAULT_HORIZON),
        )
        only = self.settings.only
        if all or only is None:
            return schedule
        return schedule.only(only.get(label, frozenset()))

    def player(
        self, label: str, faults: Any, *, nsqd: int | list[str], lookupd: int
    ) -> FaultPlayer:
        """A clock-placed player for the fixture ``label``, kept for the
        report; ``nsqd``: how many nsqds (named ``nsqd-N``), or their names."""
        names = nsqd if isinstance(nsqd, list) else [f"nsqd-{i}" for i in range(nsqd)]
        schedule = self.schedule(
            label, nsqd=len(names), lookupd=lookupd, virtual=is_virtual_clock()
        )
        player = FaultPlayer(schedule, faults, lookupd=lookupd, label=label, nsqd_names=names)
        with self._lock:
            self.players.append(player)
        return player

    def flow_player(
        self,
        label: str,
        faults: Faults | Sequence[Faults],
        *,
        nsqd_names: Sequence[str],
        lookupd_names: Sequence[str] = (),
        real: bool = False,
        msg_timeout: float = FAULTS_MSG_TIMEOUT,
        heartbeat: float = 30.0,
    ) -> FlowPlayer:
        """A flow-placed player for the TCP fixture ``label``, kept for the report."""
        schedule = self.flow_schedule(
            label, nsqd=len(nsqd_names), lookupd=len(lookupd_names), real=real
        )
        player = FlowPlayer(
            schedule,
            faults,
            nsqd_names=nsqd_names,
            lookupd_names=lookupd_names,
            label=label,
            msg_timeout=msg_timeout,
            heartbeat=heartbeat,
        )
        drawn = self.flow_schedule(
            label, nsqd=len(nsqd_names), lookupd=len(lookupd_names), real=real, all=True
        )
        with self._lock:
            self.flows.append(player)
            self._drawn[label] = drawn.ids
        return player

    def met(self) -> list[MetFault]:
        """What the clock-placed players did, in time order."""
        with self._lock:
            players = list(self.players)
        return sorted((m for p in players for m in p.met), key=lambda m: m.at)

    def flow_met(self) -> list[MetFlowFault]:
        """The flow-placed faults met, in the order they struck."""
        with self._lock:
            flows = list(self.flows)
        return sorted((m for p in flows for m in list(p.met)), key=lambda m: m.at)

    def summary(self) -> dict[str, Any]:
        """What a replay compares: the faults met (``LABEL:N``, and the
        point's description) and those scheduled."""
        with self._lock:
            flows = list(self.flows)
            drawn = list(self._drawn.items())
        return {
            "met": [m.key for m in self.flow_met()],
            # As drawn (--nsq-faults-only keeps some of them).
            "scheduled": [f"{label}:{n}" for label, ids in drawn for n in ids],
            "not_met": {
                f"{p.label}:{f.id}": f"{f.describe(p.nsqd_of(f))}: not reached, {why}"
                for p in flows
                for f, why in p.not_met()
            },
            "clock_met": [m.describe() for m in self.met()],
        }


def faults_of(request: pytest.FixtureRequest) -> TestFaults | None:
    """The test's faults, or None when ``--nsq-faults`` is off (or the test's
    marker says ``enabled=False``)."""
    node: pytest.Item = request.node
    if _STASH in node.stash:
        return node.stash[_STASH]
    settings: FaultSettings | None = request.config.stash.get(_SETTINGS, None)
    if settings is None:
        return None
    tuning: dict[str, Any] = {}
    for marker in reversed(list(node.iter_markers("nsq_faults"))):
        tuning.update(marker.kwargs)
    unknown = set(tuning) - _MARKER_OPTIONS
    if unknown:
        pytest.fail(f"nsq_faults marker: unknown option(s) {sorted(unknown)}", pytrace=False)
    if not tuning.get("enabled", True):
        return None
    kinds = tuning.get("kinds", settings.kinds)
    faults = TestFaults(
        settings=settings,
        nodeid=node.nodeid,
        rate=float(tuning.get("rate", settings.rate)),
        level=parse_level(tuning.get("level", settings.level)),
        kinds=None if kinds is None else parse_kinds(kinds),
        horizon=tuning.get("horizon"),
        redeliveries=int(tuning.get("redeliveries", DEFAULT_REDELIVERIES)),
        msg_timeout=tuning.get("msg_timeout", FAULTS_MSG_TIMEOUT),
    )
    node.stash[_STASH] = faults
    return faults


def test_faults(item: pytest.Item) -> TestFaults | None:
    """The faults ``item`` met (None: it used no faulty fixture)."""
    return item.stash.get(_STASH, None)


def settings_of(config: pytest.Config) -> FaultSettings | None:
    return config.stash.get(_SETTINGS, None)


def configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    config.stash[_SETTINGS] = FaultSettings.from_config(config)


def report_header(config: pytest.Config) -> str | None:
    settings = config.stash.get(_SETTINGS, None)
    if settings is None:
        return None
    kinds = ",".join(settings.kinds) if settings.kinds else "all"
    return (
        f"fakensq faults: seed {settings.seed}, rate {settings.rate:g}, "
        f"level {settings.level}, kinds {kinds}"
    )


def replay_args(item: pytest.Item, settings: FaultSettings, only: str | None = None) -> list[str]:
    """The arguments after ``pytest`` that run ``item`` alone with the same
    faults (``only``: a ``--nsq-faults-only`` value), from the directory pytest
    was started in."""
    invocation = item.config.invocation_params
    path, _, rest = item.nodeid.partition("::")
    where = os.path.relpath(item.config.rootpath / path, invocation.dir)
    nodeid = where + ("::" + rest if rest else "")
    extra: list[str] = []
    args = list(invocation.args)
    # Plugin switches change what runs: keep them (-p NAME, -p=NAME, -pNAME),
    # and the real nsqd, when the run had it.
    for i, arg in enumerate(args):
        if arg == "-p" and i + 1 < len(args):
            extra += ["-p", args[i + 1]]
        elif arg.startswith("-p") and len(arg) > 2:
            extra.append(arg)
    real = item.config.getoption("--nsq-real", None)
    if real is not None:
        extra.append(f"--nsq-real={real}" if real else "--nsq-real")
    return [*settings.options(only), *extra, nodeid]


def replay_command(item: pytest.Item, settings: FaultSettings, only: str | None = None) -> str:
    """The command line that runs ``item`` alone with the same faults."""
    program = "python -m pytest" if _run_as_module() else "pytest"
    return " ".join([program, *map(shlex.quote, replay_args(item, settings, only))])


def _run_as_module() -> bool:
    argv0 = Path(sys.argv[0]).name if sys.argv else ""
    return argv0 in ("__main__.py", "-m", "-c") or argv0.startswith("python")


def report_section(item: pytest.Item) -> str | None:
    """The failing test's report section: the faults met and the replay line."""
    faults = item.stash.get(_STASH, None)
    if faults is None:
        return None
    lines = [
        f"faults this test met (--nsq-faults={faults.settings.seed}: test seed {faults.seed}, "
        f"level {faults.level}, rate {faults.rate:g}):"
    ]
    flows = faults.flow_met()
    clock = faults.met()
    with faults._lock:
        players = list(faults.players)
        flow_players = list(faults.flows)
    if flow_players:
        left = [
            f"  #{f.id} [{p.label}] {f.describe(p.nsqd_of(f), p.lookupd_of(f))}: {why}"
            for p in flow_players
            for f, why in p.not_met()
        ]
        lines += _listed(_FLOW_PARTS, [m.describe() for m in flows], left)
    if players:
        left = [
            f"{e.at:8.3f}s  [{p.label}] {e.describe().replace(e.target(), p.target_of(e), 1)}"
            for p in players
            for e in not_yet_met(p.schedule, p.met)
        ]
        lines += _listed(_CLOCK_PARTS, [m.describe() for m in clock], left)
    lines.append("replay this test with the same faults:")
    lines.append("  " + replay_command(item, faults.settings))
    if flows and faults.settings.only is None:
        only = format_only((m.label, m.fault.id) for m in flows)
        lines.append("or with only the faults it met:")
        lines.append("  " + replay_command(item, faults.settings, only))
    return "\n".join(lines)


#: A report's titles for the faults placed by the flow, and by the clock:
#: those met, the line when none was, those left.
_FLOW_PARTS: Final = (
    "placed by the message flow, counted per nsqd:",
    "  (none: the flow reached no fault's point)",
    "scheduled, not reached (the flow ended first):",
)
_CLOCK_PARTS: Final = (
    "placed by the clock, seconds since the fixture started:",
    "  (none: no fault was due before the end)",
    "scheduled, not met (the test was over, or the fault still running):",
)


def _listed(parts: tuple[str, str, str], met: list[str], left: list[str]) -> list[str]:
    """A report's part for one way of placing faults: those met, then those
    left (under their own title, when there are some)."""
    title, none, left_title = parts
    return [title, *(met or [none]), *([left_title, *left] if left else [])]


def record_outcome(item: pytest.Item, report: pytest.TestReport) -> None:
    """Keep what a replay compares on ``report`` (the test's last phase):
    the faults met, and how the test ended."""
    faults = item.stash.get(_STASH, None)
    if faults is None:
        return
    doc = faults.summary()
    doc["nodeid"] = item.nodeid
    doc["replay"] = replay_args(item, faults.settings)
    doc.update(item.stash.get(_OUTCOME, {"outcome": "passed"}))
    report.user_properties.append(("nsq_faults", json.dumps(doc)))
    path = faults.settings.record
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(doc) + "\n")


_OUTCOME: Final = pytest.StashKey[dict[str, Any]]()


def note_call(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]) -> None:
    """Keep how a phase of the test failed: the exception (the one inside an
    exception group of one) and the line of the project's code it came from."""
    if not report.failed or _STASH not in item.stash or call.excinfo is None:
        return
    exc: BaseException = call.excinfo.value
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    root = str(item.config.rootpath)
    where = "?"
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.startswith(root) and "site-packages" not in filename:
            where = f"{os.path.relpath(filename, root)}:{tb.tb_lineno}"
        tb = tb.tb_next
    item.stash[_OUTCOME] = {
        "outcome": "failed",
        "when": report.when,
        "error": type(exc).__name__,
        "where": where,
        "message": (str(exc).splitlines() or [""])[0][:300],
    }


# -- what the fixtures run -----------------------------------------------------


def is_virtual_clock() -> bool:
    """Whether the running Trio loop's clock is a MockClock (virtual time)."""
    import trio.testing

    return isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)


@asynccontextmanager
async def _running(run: Callable[..., Awaitable[None]]) -> AsyncIterator[None]:
    """A player's ``run`` (started: watching) while inside, cancelled after."""
    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def playing(
    faults: TestFaults, label: str, target: Any, *, nsqd: int | list[str], lookupd: int
) -> AsyncIterator[FaultPlayer]:
    """Play ``label``'s clock-placed schedule on ``target`` (a ``Faults``)
    while inside; ``nsqd``: how many nsqds (named ``nsqd-N``), or their names."""
    player = faults.player(label, target, nsqd=nsqd, lookupd=lookupd)
    async with _running(player.run):
        yield player


@asynccontextmanager
async def flowing(player: FlowPlayer) -> AsyncIterator[FlowPlayer]:
    """``player`` watching the flow while inside; it heals what it started
    and starts what it took down when it ends."""
    async with _running(player.run):
        yield player
    with trio.CancelScope(shield=True):
        await player.settle()


@asynccontextmanager
async def faulty_nsqd(
    faults: TestFaults, label: str, make: Callable[[], NSQD]
) -> AsyncIterator[NSQD]:
    """A lone nsqd (restartable in place) named ``label``, playing its faults
    as the messages flow."""
    from .faults import Faults
    from .restartable import RestartableNSQD

    nsqd = make()
    node = RestartableNSQD(nsqd, name=label)
    injector = Faults(node)
    injector.attach_nsqd(node.name, nsqd)
    player = faults.flow_player(
        label,
        injector,
        nsqd_names=[label],
        msg_timeout=nsqd.options.msg_timeout,
        heartbeat=nsqd.options.default_heartbeat_interval,
    )
    async with node, flowing(player):
        yield nsqd


@asynccontextmanager
async def faulty_cluster(
    faults: TestFaults, label: str, cluster: Cluster, nsqd: int, lookupd: int
) -> AsyncIterator[Cluster]:
    """``cluster`` playing ``label``'s faults: placed by the clock on a
    simulated network, by the message flow on real sockets."""
    if cluster.network is not None:
        async with cluster, playing(faults, label, cluster.faults, nsqd=nsqd, lookupd=lookupd):
            yield cluster
        return
    async with cluster:
        options = cluster.nsqd(0).options
        player = faults.flow_player(
            label,
            cluster.faults,
            nsqd_names=[f"nsqd-{i}" for i in range(nsqd)],
            lookupd_names=[f"lookupd-{i}" for i in range(lookupd)],
            msg_timeout=options.msg_timeout,
            heartbeat=options.default_heartbeat_interval,
        )
        async with flowing(player):
            yield cluster
