"""``/debug/pprof/*``: Go's ``net/http/pprof`` endpoints, over the Python process.

nsqd and nsqlookupd v1.3.0 mount Go's profiler on their HTTP APIs.  fakensq
mounts the same routes, with the same methods, parameters, status codes, headers
and formats, filled with what the Python process can tell about itself:

- ``goroutine``: one stack per Trio task of the serving loop and per thread;
- ``threadcreate``: the threads;
- ``heap``: what :mod:`tracemalloc` traced, when it is tracing (nothing else);
- ``block``: empty (Go's too, until a block profile rate is set; Python has none);
- ``profile``: a CPU profile of every thread, sampled at 100 Hz, each sample
  weighted by the CPU time the thread used since the previous one;
- ``cmdline``: ``sys.argv``; ``symbol``: no address resolves (``num_symbols: 1``).

``?debug=0`` (the default) answers a gzipped ``profile.proto`` that
``go tool pprof`` reads; ``?debug=1`` the legacy text; ``goroutine?debug=2``
a stack dump.  Python code has no program counters: a "location" is a code
object (its ``id``) and line.
"""

from __future__ import annotations

import gzip
import html
import math
import re
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

import trio

from .server import Request, Response

__all__ = ["add_routes", "Frame", "Stack", "encode_profile"]

Route = Callable[[Request], Awaitable[Response]]
AddRoute = Callable[[str, str, Route], None]

_NOSNIFF = ("X-Content-Type-Options", "nosniff")
_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)
_TEXT = ("Content-Type", "text/plain; charset=utf-8")

#: The profiles a Go program lists, with the index page's descriptions.
_DESCRIPTIONS = {
    "allocs": "A sampling of all past memory allocations",
    "block": "Stack traces that led to blocking on synchronization primitives",
    "cmdline": "The command line invocation of the current program",
    "goroutine": "Stack traces of all current goroutines. Use debug=2 as a query "
    "parameter to export in the same format as an unrecovered panic.",
    "goroutineleak": "Stack traces of all leaked goroutines. Use debug=2 as a query "
    "parameter to export in the same format as an unrecovered panic.",
    "heap": "A sampling of memory allocations of live objects. You can specify the gc "
    "GET parameter to run GC before taking the heap sample.",
    "mutex": "Stack traces of holders of contended mutexes",
    "profile": "CPU profile. You can specify the duration in the seconds GET parameter. "
    "After you get the profile file, use the go tool pprof command to investigate "
    "the profile.",
    "symbol": "Maps given program counters to function names. Counters can be specified "
    "in a GET raw query or POST body, multiple counters are separated by '+'.",
    "threadcreate": "Stack traces that led to the creation of new OS threads",
    "trace": "A trace of execution of the current program. You can specify the duration "
    "in the seconds GET parameter. After you get the trace file, use the go tool "
    "trace command to investigate the trace.",
}


def add_routes(add: AddRoute, *, index: str) -> None:
    """Mount the routes nsqd (``index="/debug/pprof/"``) and nsqlookupd
    (``index="/debug/pprof"``) mount."""
    add("GET", index, _index)
    add("GET", "/debug/pprof/cmdline", _cmdline)
    add("GET", "/debug/pprof/symbol", _symbol)
    add("POST", "/debug/pprof/symbol", _symbol)
    add("GET", "/debug/pprof/profile", _cpu_profile)
    for name in ("heap", "goroutine", "block", "threadcreate"):
        add("GET", f"/debug/pprof/{name}", _profile_handler(name))


# --- stacks ----------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One stack frame: a function (its code object's id) at a line."""

    code_id: int
    function: str
    filename: str
    line: int
    start_line: int


@dataclass
class Stack:
    """A goroutine's stand-in: a name, a state, frames innermost first."""

    name: str
    state: str
    frames: list[Frame] = field(default_factory=list)


def _frames_from(frame: FrameType | None) -> list[Frame]:
    out: list[Frame] = []
    while frame is not None:
        out.append(_frame(frame, frame.f_lineno or 0))
        frame = frame.f_back
    return out


def _frame(frame: FrameType, line: int) -> Frame:
    code = frame.f_code
    return Frame(id(code), code.co_qualname, code.co_filename, line, code.co_firstlineno)


def _trio_tasks() -> Iterator[trio.lowlevel.Task]:
    try:
        root = trio.lowlevel.current_root_task()
    except RuntimeError:
        return
    if root is None:
        return
    todo = [root]
    while todo:
        task = todo.pop()
        yield task
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)


def _thread_frames() -> dict[int, FrameType]:
    """Every thread's current frame, by thread id: CPython's
    ``sys._current_frames``, the one way to see another thread's stack (neither
    threading nor faulthandler gives frames); none where it is missing."""
    if not hasattr(sys, "_current_frames"):
        return {}
    return dict(sys._current_frames())


def current_stacks() -> list[Stack]:
    """The Trio tasks of the calling loop, then every other thread."""
    stacks: list[Stack] = []
    me = trio.lowlevel.current_task() if _in_trio() else None
    for task in _trio_tasks():
        frames = [_frame(f, line) for f, line in task.iter_await_frames()]
        frames.reverse()  # innermost first, as pprof lists them
        stacks.append(Stack(task.name, "running" if task is me else "select", frames))
    this_thread = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in _thread_frames().items():
        if ident == this_thread and stacks:
            continue  # the loop's thread: its tasks are listed
        stacks.append(Stack(names.get(ident, f"thread-{ident}"), "syscall", _frames_from(frame)))
    return stacks


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


# --- profile.proto ----------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _field_bytes(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _packed(number: int, values: list[int]) -> bytes:
    return _field_bytes(number, b"".join(_varint(v) for v in values))


class _Strings:
    def __init__(self) -> None:
        self.table = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.table)
            self.table.append(text)
        return found


def encode_profile(
    sample_types: list[tuple[str, str]],
    samples: list[tuple[list[Frame], list[int]]],
    *,
    period_type: tuple[str, str],
    period: int,
    duration_ns: int = 0,
) -> bytes:
    """A gzipped ``perftools.profiles.Profile`` (what ``go tool pprof`` reads)."""
    strings = _Strings()
    functions: dict[int, int] = {}
    locations: dict[tuple[int, int], int] = {}
    body = bytearray()
    for kind, unit in sample_types:
        body += _field_bytes(1, _field_varint(1, strings(kind)) + _field_varint(2, strings(unit)))
    function_msgs = bytearray()
    location_msgs = bytearray()
    for frames, values in samples:
        ids: list[int] = []
        for fr in frames:
            fid = functions.get(fr.code_id)
            if fid is None:
                fid = functions[fr.code_id] = len(functions) + 1
                function_msgs += _field_bytes(
                    5,
                    _field_varint(1, fid)
                    + _field_varint(2, strings(fr.function))
                    + _field_varint(3, strings(fr.function))
                    + _field_varint(4, strings(fr.filename))
                    + _field_varint(5, fr.start_line),
                )
            key = (fr.code_id, fr.line)
            lid = locations.get(key)
            if lid is None:
                lid = locations[key] = len(locations) + 1
                line = _field_varint(1, fid) + _field_varint(2, fr.line)
                location_msgs += _field_bytes(4, _field_varint(1, lid) + _field_bytes(4, line))
            ids.append(lid)
        body += _field_bytes(2, _packed(1, ids) + _packed(2, values))
    body += location_msgs + function_msgs
    period_msg = _field_varint(1, strings(period_type[0])) + _field_varint(
        2, strings(period_type[1])
    )
    tail = (
        _field_varint(9, time.time_ns())
        + _field_varint(10, duration_ns)
        + _field_bytes(11, period_msg)
        + _field_varint(12, period)
    )
    for text in strings.table:
        body += _field_bytes(6, text.encode())
    body += tail
    return gzip.compress(bytes(body))


# --- handlers ----------------------------------------------------------------


def _parse_int(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: None where Go's fails (no spaces, no
    underscores, within int64)."""
    if not _DECIMAL.fullmatch(text):
        return None
    value = int(text)
    return value if -(1 << 63) <= value < (1 << 63) else None


def _form_int(request: Request, name: str) -> int:
    """``strconv.Atoi(r.FormValue(name))`` with the error ignored (0)."""
    raw = request.arg(name) or ""
    try:
        return int(raw) if raw.lstrip("+-").isdigit() else 0
    except ValueError:
        return 0


def _error(status: int, text: str) -> Response:
    # pprof's serveError: plain text and a newline, with a Go debug header.
    return Response(
        status,
        text.encode() + b"\n",
        [("Content-Type", "text/plain; charset=utf-8"), ("X-Go-Pprof", "1"), _NOSNIFF],
    )


def _counts() -> dict[str, int]:
    stacks = current_stacks()
    heap = len(_heap_samples()[0])
    return {
        "allocs": heap,
        "block": 0,
        "cmdline": 0,
        "goroutine": len(stacks),
        "goroutineleak": 0,  # Trio tasks cannot leak unseen: a nursery holds each
        "heap": heap,
        "mutex": 0,
        "profile": 0,
        "symbol": 0,
        "threadcreate": threading.active_count(),
        "trace": 0,
    }


def _template_escape(text: str) -> str:
    # html/template's escaping of text: quotes as numeric references.
    return html.escape(text, quote=False).replace('"', "&#34;").replace("'", "&#39;")


async def _index(request: Request) -> Response:
    rows = "".join(
        f"<tr><td>{count}</td><td><a href='{name}?debug=1'>{name}</a></td></tr>\n"
        for name, count in _counts().items()
    )
    descriptions = "".join(
        f"<li><div class=profile-name>{name}: </div> {_template_escape(text)}</li>\n"
        for name, text in _DESCRIPTIONS.items()
    )
    page = (
        "<html>\n<head>\n<title>/debug/pprof/</title>\n<style>\n.profile-name{\n"
        "\tdisplay:inline-block;\n\twidth:6rem;\n}\n</style>\n</head>\n<body>\n"
        "/debug/pprof/\n<br>\n<p>Set debug=1 as a query parameter to export in legacy "
        "text format</p>\n<br>\nTypes of profiles available:\n<table>\n"
        "<thead><td>Count</td><td>Profile</td></thead>\n"
        f"{rows}</table>\n"
        '<a href="goroutine?debug=2">full goroutine stack dump</a>\n<br>\n<p>\n'
        f"Profile Descriptions:\n<ul>\n{descriptions}</ul>\n</p>\n</body>\n</html>"
    )
    return Response(200, page.encode(), [("Content-Type", "text/html; charset=utf-8"), _NOSNIFF])


async def _cmdline(request: Request) -> Response:
    return Response(200, "\x00".join(sys.argv).encode(), [_NOSNIFF, _TEXT])


async def _symbol(request: Request) -> Response:
    # Go resolves each program counter it is given; a Python process has none
    # to resolve, so the answer is the header alone.
    return Response(200, b"num_symbols: 1\n", [_NOSNIFF, _TEXT])


_DELTA_PROFILES = {"allocs", "block", "goroutine", "heap", "mutex", "threadcreate"}


def _profile_handler(name: str) -> Route:
    async def handler(request: Request) -> Response:
        seconds = request.arg("seconds") or ""
        if seconds:
            return await _delta(name, request, seconds)
        if name == "heap" and _form_int(request, "gc") > 0:
            import gc

            gc.collect()
        debug = _form_int(request, "debug")
        if debug:
            return Response(200, _legacy_text(name, debug).encode(), [_NOSNIFF, _TEXT])
        return _binary(name, _binary_profile(name), name)

    return handler


def _binary(name: str, data: bytes, filename: str) -> Response:
    return Response(
        200,
        data,
        [
            _NOSNIFF,
            ("Content-Type", "application/octet-stream"),
            ("Content-Disposition", f'attachment; filename="{filename}"'),
        ],
    )


async def _delta(name: str, request: Request, seconds: str) -> Response:
    value = _parse_int(seconds) or 0
    if value <= 0:
        return _error(400, 'invalid value for "seconds" - must be a positive integer')
    if name not in _DELTA_PROFILES:
        return _error(400, '"seconds" parameter is not supported for this profile type')
    if _form_int(request, "debug"):
        return _error(400, "seconds and debug params are incompatible")
    before = _samples(name)
    with trio.move_on_after(value):
        await request.peer_gone.wait()
        # Go's answer when the request's context ends first (the client left).
        return _error(500, "context canceled")
    after = _samples(name)
    # What changed over the interval: values subtracted stack by stack.
    delta: dict[tuple[Frame, ...], list[int]] = {}
    for key in after.keys() | before.keys():
        zero = [0] * len(_SPECS[name][0])
        values = [a - b for a, b in zip(after.get(key, zero), before.get(key, zero), strict=True)]
        if any(values):
            delta[key] = values
    data = _encode(name, delta, duration_ns=value * 1_000_000_000)
    return _binary(name, data, f"{name}-delta")


#: Each profile's sample types, period type and period (as Go's runtime/pprof).
_SPECS: dict[str, tuple[list[tuple[str, str]], tuple[str, str], int]] = {
    "heap": (
        [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ],
        ("space", "bytes"),
        512 * 1024,
    ),
    "block": ([("contentions", "count"), ("delay", "nanoseconds")], ("contentions", "count"), 1),
    "goroutine": ([("goroutine", "count")], ("goroutine", "count"), 1),
    "threadcreate": ([("threadcreate", "count")], ("threadcreate", "count"), 1),
}


def _samples(name: str) -> dict[tuple[Frame, ...], list[int]]:
    """The profile's samples now, by stack (innermost frame first)."""
    out: dict[tuple[Frame, ...], list[int]] = {}
    if name == "heap":
        for frames, count, size in _heap_samples()[0]:
            out[tuple(frames)] = [count, size, count, size]
    elif name in ("goroutine", "threadcreate"):
        stacks = current_stacks() if name == "goroutine" else _thread_stacks()
        for stack in stacks:
            key = tuple(stack.frames)
            out[key] = [out.get(key, [0])[0] + 1]
    return out  # block: Python has no such profile (Go's is empty by default too)


def _encode(name: str, samples: dict[tuple[Frame, ...], list[int]], duration_ns: int = 0) -> bytes:
    sample_types, period_type, period = _SPECS[name]
    return encode_profile(
        sample_types,
        [(list(key), values) for key, values in samples.items()],
        period_type=period_type,
        period=period,
        duration_ns=duration_ns,
    )


def _binary_profile(name: str) -> bytes:
    return _encode(name, _samples(name))


def _thread_stacks() -> list[Stack]:
    names = {t.ident: t.name for t in threading.enumerate()}
    return [
        Stack(names.get(ident, str(ident)), "running", _frames_from(frame))
        for ident, frame in _thread_frames().items()
    ]


def _heap_samples() -> tuple[list[tuple[list[Frame], int, int]], int]:
    """tracemalloc's live blocks by traceback (when it traces), and its total."""
    if not tracemalloc.is_tracing():
        return [], 0
    snapshot = tracemalloc.take_snapshot()
    out: list[tuple[list[Frame], int, int]] = []
    total = 0
    for stat in snapshot.statistics("traceback"):
        frames = [
            Frame(hash((f.filename, f.lineno)), f"{f.filename}:{f.lineno}", f.filename, f.lineno, 0)
            for f in reversed(stat.traceback)
        ]
        out.append((frames, stat.count, stat.size))
        total += stat.size
    return out, total


def _stack_text(frames: list[Frame]) -> str:
    addresses = " ".join(f"{fr.code_id:#x}" for fr in frames)
    lines = "".join(
        f"#\t{fr.code_id:#x}\t{fr.function}+{fr.line - fr.start_line:#x}\t{fr.filename}:{fr.line}\n"
        for fr in frames
    )
    return f"@ {addresses}\n{lines}\n"


def _legacy_text(name: str, debug: int) -> str:
    if name == "block":
        return f"--- contention:\ncycles/second={_cycles_per_second()}\n"
    if name == "heap":
        samples, total = _heap_samples()
        count = sum(c for _, c, _ in samples)
        out = [f"heap profile: {count}: {total} [{count}: {total}] @ heap/{512 * 1024}\n"]
        for frames, c, size in samples:
            out.append(f"{c}: {size} [{c}: {size}] {_stack_text(frames)}")
        out.append(_memstats_text())
        return "".join(out)
    if name == "goroutine" and debug >= 2:
        return "".join(_panic_style(i, stack) for i, stack in enumerate(current_stacks(), 1))
    stacks = current_stacks() if name == "goroutine" else _thread_stacks()
    grouped = Counter(tuple(stack.frames) for stack in stacks)
    out = [f"{name} profile: total {len(stacks)}\n"]
    for key, count in grouped.most_common():
        out.append(f"{count} {_stack_text(list(key))}")
    return "".join(out)


def _panic_style(number: int, stack: Stack) -> str:
    lines = [f"goroutine {number} [{stack.state}]:\n"]
    for fr in stack.frames:
        lines.append(f"{fr.function}(...)\n\t{fr.filename}:{fr.line}\n")
    return "".join(lines) + "\n"


def _memstats_text() -> str:
    import gc
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    collections = sum(s["collections"] for s in gc.get_stats())
    return (
        "\n# runtime.MemStats\n"
        f"# Alloc = {tracemalloc.get_traced_memory()[0]}\n"
        f"# Sys = {rss}\n"
        f"# HeapObjects = {sys.getallocatedblocks()}\n"
        f"# NumGC = {collections}\n"
    )


def _cycles_per_second() -> int:
    # Go reports its CPU tick rate; Python's clocks tick in nanoseconds.
    return 1_000_000_000


# --- the CPU profile -----------------------------------------------------------

_SAMPLE_HZ = 100

#: Held while a CPU profile runs: one at a time in the process, as Go's
#: runtime allows one (``pprof.StartCPUProfile``: "cpu profiling already in use").
_CPU_PROFILING = threading.Lock()


def _sample_cpu(seconds: float, stop: threading.Event) -> list[tuple[list[Frame], list[int]]]:
    """Every thread's stack at each tick, weighted by the CPU time it used,
    until ``seconds`` have passed or ``stop`` is set (within a tick)."""
    me = threading.get_ident()
    last: dict[int, int] = {}
    weights: Counter[tuple[Frame, ...]] = Counter()
    counts: Counter[tuple[Frame, ...]] = Counter()
    deadline = time.monotonic() + seconds
    while not stop.wait(1 / _SAMPLE_HZ) and time.monotonic() < deadline:
        for ident, frame in _thread_frames().items():
            if ident == me:
                continue
            try:
                clock = time.pthread_getcpuclockid(ident)
                used = time.clock_gettime_ns(clock)
            except (OSError, AttributeError, ValueError):
                continue
            delta = used - last.get(ident, used)
            last[ident] = used
            if delta > 0:
                key = tuple(_frames_from(frame))
                weights[key] += delta
                counts[key] += 1
    return [(list(key), [counts[key], weights[key]]) for key in weights]


async def _stop_when_gone(request: Request, stop: threading.Event) -> None:
    # The profile ends when the client does (Go's sleep(r, d) returns on
    # r.Context().Done()), and when the server stops (cancelled here).
    try:
        await request.peer_gone.wait()
    finally:
        stop.set()


async def _cpu_profile(request: Request) -> Response:
    seconds = _parse_int(request.arg("seconds") or "") or 0
    if seconds <= 0:
        seconds = 30
    if not _CPU_PROFILING.acquire(blocking=False):
        return _error(500, "Could not enable CPU profiling: cpu profiling already in use")
    try:
        stop = threading.Event()
        started = time.monotonic_ns()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_when_gone, request, stop)
            # Its own limiter: the sampler never waits for (nor takes) a token
            # of Trio's default one, which other work of the process shares.
            # Not abandoned on cancel: the sampler ends within a tick once
            # ``stop`` is set, and no thread outlives the request.
            samples = await trio.to_thread.run_sync(
                _sample_cpu, float(seconds), stop, limiter=trio.CapacityLimiter(1)
            )
            nursery.cancel_scope.cancel()
        elapsed = time.monotonic_ns() - started
    finally:
        _CPU_PROFILING.release()
    data = encode_profile(
        [("samples", "count"), ("cpu", "nanoseconds")],
        samples,
        period_type=("cpu", "nanoseconds"),
        period=math.floor(1e9 / _SAMPLE_HZ),
        duration_ns=min(elapsed, seconds * 1_000_000_000),
    )
    return _binary("profile", data, "profile")
