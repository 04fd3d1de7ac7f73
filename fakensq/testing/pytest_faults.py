"""``pytest --nsq-faults=SEED``: every test using fakensq's fixtures meets faults.

The pytest plugin (:mod:`fakensq.pytest_plugin`) takes its options and hooks
from here.  With ``--nsq-faults=SEED``, each fixture a test uses (``nsqd``,
``nsqd_factory``'s nodes, ``nsq_cluster``, ``sim_cluster``) plays a fault
schedule (:mod:`fakensq.testing.schedule`) drawn from the seed and the test's node id,
so the same seed and test always get the same schedule, whatever else runs.  A
failing test's report shows the faults it met, with their times and outcomes,
and the command line that replays that one test with the same schedule.

Tuning: ``--nsq-faults-rate`` (the mean number of faults a fixture plays in a
test), ``--nsq-faults-level`` (``safe``, ``harsh``, ``lossy``: see
:mod:`fakensq.testing.schedule`), ``--nsq-faults-kinds`` (only these), and per test
``@pytest.mark.nsq_faults(rate=..., level=..., kinds=[...], horizon=...,
redeliveries=..., msg_timeout=..., enabled=False)``.  Without ``--nsq-faults``
nothing changes and the marker does nothing.

Time: faults land within the first ``horizon`` seconds of the test: 3 real
seconds for the TCP fixtures, 120 seconds for a ``sim_cluster`` on a
``MockClock`` (virtual seconds cost nothing).  The TCP fixtures' nsqds get a
``msg_timeout`` of :data:`FAULTS_MSG_TIMEOUT` seconds (unless the test sets one),
so that the messages a dropped consumer held come back within a test's
patience rather than after nsqd's 60 s.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
import trio

from .faultplayer import FaultPlayer, MetFault, not_yet_met
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

__all__ = [
    "FAULTS_MSG_TIMEOUT",
    "FaultSettings",
    "TestFaults",
    "add_options",
    "faults_of",
    "report_section",
]

#: The TCP fixtures' nsqds' msg_timeout under ``--nsq-faults`` (seconds).
FAULTS_MSG_TIMEOUT: Final = 3.0
#: Over how many seconds a test's faults are spread, by default: real time
#: (TCP fixtures) and virtual time (a sim_cluster on a MockClock).
REAL_HORIZON: Final = 2.0
VIRTUAL_HORIZON: Final = 120.0
DEFAULT_RATE: Final = 4.0

MARKER: Final = (
    "nsq_faults(rate=, level=, kinds=, horizon=, redeliveries=, msg_timeout=, enabled=): "
    "tune the faults `pytest --nsq-faults=SEED` injects into this test's fakensq fixtures"
)

_STASH: Final = pytest.StashKey["TestFaults"]()


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


@dataclass(frozen=True)
class FaultSettings:
    """What ``--nsq-faults*`` asked for (the session's defaults)."""

    seed: int
    rate: float = DEFAULT_RATE
    level: Level = "safe"
    kinds: tuple[str, ...] | None = None

    @classmethod
    def from_config(cls, config: pytest.Config) -> FaultSettings | None:
        """The settings, or None without ``--nsq-faults``; ``pytest.UsageError``
        (one line) for a malformed value."""
        raw = config.getoption("--nsq-faults")
        rate = config.getoption("--nsq-faults-rate")
        level = config.getoption("--nsq-faults-level")
        kinds = config.getoption("--nsq-faults-kinds")
        try:
            if raw is None:
                if rate is not None or level is not None or kinds is not None:
                    raise ValueError("--nsq-faults-rate/-level/-kinds need --nsq-faults=SEED")
                return None
            return cls(
                seed=_seed(raw),
                rate=DEFAULT_RATE if rate is None else _rate(rate),
                level=parse_level("safe" if level is None else level),
                kinds=None if kinds is None else parse_kinds(kinds.split(",")),
            )
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None

    def options(self) -> list[str]:
        """The command-line options that give these settings."""
        out = [f"--nsq-faults={self.seed}"]
        if self.rate != DEFAULT_RATE:
            out.append(f"--nsq-faults-rate={self.rate:g}")
        if self.level != "safe":
            out.append(f"--nsq-faults-level={self.level}")
        if self.kinds is not None:
            out.append("--nsq-faults-kinds=" + ",".join(self.kinds))
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
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def seed(self) -> int:
        """The test's own seed (from the session's and the node id)."""
        return seed_for(self.settings.seed, self.nodeid)

    def schedule(self, label: str, *, nsqd: int, lookupd: int, virtual: bool) -> FaultSchedule:
        """The schedule of the fixture ``label`` (the same for the same test,
        seed and label)."""
        import random

        horizon = self.horizon or (VIRTUAL_HORIZON if virtual else REAL_HORIZON)
        rng = random.Random(seed_for(self.seed, label))
        return draw_schedule(
            rng,
            rate=self.rate,
            horizon=horizon,
            level=self.level,
            kinds=self.kinds,
            nsqd=nsqd,
            lookupd=lookupd,
            redeliveries=self.redeliveries,
        )

    def player(
        self, label: str, faults: Any, *, nsqd: int | list[str], lookupd: int, virtual: bool
    ) -> FaultPlayer:
        """A player for the fixture ``label``, kept for the report; ``nsqd``: how
        many nsqds (named ``nsqd-N``), or their names."""
        names = nsqd if isinstance(nsqd, list) else [f"nsqd-{i}" for i in range(nsqd)]
        schedule = self.schedule(label, nsqd=len(names), lookupd=lookupd, virtual=virtual)
        player = FaultPlayer(schedule, faults, lookupd=lookupd, label=label, nsqd_names=names)
        with self._lock:
            self.players.append(player)
        return player

    def met(self) -> list[MetFault]:
        with self._lock:
            players = list(self.players)
        return sorted((m for p in players for m in p.met), key=lambda m: m.at)


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
    unknown = set(tuning) - {
        "rate",
        "level",
        "kinds",
        "horizon",
        "redeliveries",
        "msg_timeout",
        "enabled",
    }
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


_SETTINGS: Final = pytest.StashKey[FaultSettings | None]()


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


def replay_command(item: pytest.Item, settings: FaultSettings) -> str:
    """The command line that runs ``item`` alone with the same faults, from the
    directory pytest was started in."""
    invocation = item.config.invocation_params
    path, _, rest = item.nodeid.partition("::")
    where = os.path.relpath(item.config.rootpath / path, invocation.dir)
    nodeid = where + ("::" + rest if rest else "")
    extra: list[str] = []
    args = list(invocation.args)
    # Plugin switches change what runs: keep them (-p NAME, -p=NAME, -pNAME).
    for i, arg in enumerate(args):
        if arg == "-p" and i + 1 < len(args):
            extra += ["-p", args[i + 1]]
        elif arg.startswith("-p") and len(arg) > 2:
            extra.append(arg)
    program = "python -m pytest" if _run_as_module() else "pytest"
    return " ".join([program, *settings.options(), *map(shlex.quote, extra), shlex.quote(nodeid)])


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
        f"level {faults.level}, rate {faults.rate:g}), seconds since its fixture started:"
    ]
    met = faults.met()
    lines += [m.describe() for m in met] or ["  (none: no fault was due before the test ended)"]
    with faults._lock:
        players = list(faults.players)
    left = [
        f"{e.at:8.3f}s  [{p.label}] {e.describe().replace(e.target(), p.target_of(e), 1)}"
        for p in players
        for e in not_yet_met(p.schedule, p.met)
    ]
    if left:
        lines.append("scheduled, not met (the test was over, or the fault still running):")
        lines += left
    lines.append("replay this test with the same faults:")
    lines.append("  " + replay_command(item, faults.settings))
    return "\n".join(lines)


# -- what the fixtures run -----------------------------------------------------


def is_virtual_clock() -> bool:
    """Whether the running Trio loop's clock is a MockClock (virtual time)."""
    import trio.testing

    return isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)


@asynccontextmanager
async def playing(
    faults: TestFaults, label: str, target: Any, *, nsqd: int | list[str], lookupd: int
) -> AsyncIterator[FaultPlayer]:
    """Play ``label``'s schedule on ``target`` (a ``Faults``) while inside;
    ``nsqd``: how many nsqds (named ``nsqd-N``), or their names."""
    player = faults.player(label, target, nsqd=nsqd, lookupd=lookupd, virtual=is_virtual_clock())
    async with trio.open_nursery() as nursery:
        await nursery.start(player.run)
        try:
            yield player
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def faulty_nsqd(
    faults: TestFaults, label: str, make: Callable[[], NSQD]
) -> AsyncIterator[NSQD]:
    """A lone nsqd (restartable in place) named ``label``, playing its faults."""
    from .faults import Faults
    from .restartable import RestartableNSQD

    nsqd = make()
    node = RestartableNSQD(nsqd, name=label)
    injector = Faults(node)
    injector.attach_nsqd(node.name, nsqd)
    async with node, playing(faults, label, injector, nsqd=[label], lookupd=0):
        yield nsqd


@asynccontextmanager
async def faulty_cluster(
    faults: TestFaults, label: str, cluster: Cluster, nsqd: int, lookupd: int
) -> AsyncIterator[Cluster]:
    """``cluster`` playing ``label``'s faults."""
    async with cluster, playing(faults, label, cluster.faults, nsqd=nsqd, lookupd=lookupd):
        yield cluster
