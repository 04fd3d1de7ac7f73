"""Peak memory of a consumer against a hostile nsqd, one case a child process.

This process runs the hostile nsqd of the client's tests
(:mod:`tests.client.hostile`, listening on 127.0.0.1); a child process runs a
``trionsq.Consumer`` against it (a handler taking 1 ms a message) and the
child's peak resident set (``VmHWM``) is read from ``/proc`` once the server
has sent all it meant to, or has been unable to write for two seconds (the
client stopped reading), or after a minute.

The child imports whichever trionsq ``PYTHONPATH`` gives it: run the script
once on a tree before a change and once after to compare::

    python benchmarks/bench_hostile_memory.py                     # this tree
    python benchmarks/bench_hostile_memory.py --client-tree ../old

Linux only (``/proc``).  Cases (each about what the server tries to send):

- ``flood``: messages beyond RDY without end (256 MiB), max_in_flight 1;
- ``flood-never-reads``: the same, from a server that reads nothing (the
  client's FINs pile up), max_in_flight 100;
- ``heartbeats-never-reads``: heartbeats without end (64 MiB), nothing read;
- ``deflate-zeros`` / ``deflate-messages``: ~1 GiB inflated from a few MB;
- ``snappy-messages``: ~1 GiB inflated from ~50 MB;
- ``huge-length``: a message frame announcing 2**31-1 bytes, 256 MiB of it sent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.client.hostile import (  # noqa: E402
    HostileConn,
    HostileNSQD,
    deflate_block,
    message,
    snappy_bomb_chunk,
)
from trionsq.protocol.frames import FRAME_TYPE_MESSAGE, HEARTBEAT, encode_response  # noqa: E402

MiB = 1024 * 1024
CHILD = """
import sys, json, trio, trionsq
address, options = sys.argv[1], json.loads(sys.argv[2])
async def handler(message):
    await trio.sleep(0.001)
async def main():
    async with trionsq.Consumer("topic", "chan", nsqd_tcp_addresses=[address],
                                handler=handler, **options):
        print("ready", trionsq.__file__, flush=True)
        await trio.sleep_forever()
trio.run(main)
"""

Script = Callable[[HostileConn], Awaitable[None]]


def _flood(total: int) -> Script:
    async def script(conn: HostileConn) -> None:
        index = 0
        while conn.sent_bytes < total:
            frames = b"".join(message(index + i, b"x" * 100) for i in range(500))
            index += 500
            await conn.send_messages(frames, 500)

    return script


def _heartbeats(total: int) -> Script:
    frame = encode_response(HEARTBEAT) * 4000

    async def script(conn: HostileConn) -> None:
        while conn.sent_bytes < total:
            await conn.send(frame)

    return script


def _raw_repeated(block: bytes, total: int, head: bytes = b"") -> Script:
    batch = block * max(1, 60_000 // len(block))

    async def script(conn: HostileConn) -> None:
        if head:
            await conn.send(head)
        while conn.sent_bytes < total:
            await conn.send_raw(batch)

    return script


def _huge_length(total: int) -> Script:
    head = (2**31 - 1).to_bytes(4, "big") + FRAME_TYPE_MESSAGE.to_bytes(4, "big")
    head += message(7, b"")[8:34]
    chunk = b"\0" * 65536

    async def script(conn: HostileConn) -> None:
        await conn.send(head)
        while conn.sent_bytes < total:
            await conn.send(chunk)

    return script


def cases() -> dict[str, tuple[Script, dict[str, Any], dict[str, Any]]]:
    """name -> (script, server options, consumer options)"""
    messages = b"".join(message(i, b"x" * 100) for i in range(489))  # one snappy chunk
    return {
        "flood": (_flood(256 * MiB), {}, {"max_in_flight": 1}),
        "flood-never-reads": (_flood(256 * MiB), {"reads": False}, {"max_in_flight": 100}),
        "heartbeats-never-reads": (_heartbeats(64 * MiB), {"reads": False}, {}),
        "deflate-zeros": (
            _raw_repeated(deflate_block(b"\0" * MiB), 4 * MiB),
            {"compression": "deflate"},
            {"deflate": True},
        ),
        "deflate-messages": (
            _raw_repeated(deflate_block(messages * 16), 16 * MiB),
            {"compression": "deflate"},
            {"deflate": True, "max_in_flight": 1},
        ),
        "snappy-messages": (
            _raw_repeated(snappy_bomb_chunk(messages), 48 * MiB),
            {"compression": "snappy"},
            {"snappy": True, "max_in_flight": 1},
        ),
        "huge-length": (_huge_length(256 * MiB), {}, {}),
    }


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


async def run_case(
    name: str, script: Script, server: dict[str, Any], options: dict[str, Any], tree: str
) -> dict[str, Any]:
    async with trio.open_nursery() as nursery:
        hostile = HostileNSQD(nursery, script, transport="tcp", **server)
        address = await hostile.listen()
        env = {**os.environ, "PYTHONPATH": tree}
        # (Popen returns once the child is started; it is read from a thread)
        child = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-c", CHILD, address, json.dumps(options)],
            env=env,
            cwd=tree,  # "-c" puts the working directory first on sys.path
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert child.stdout is not None
            line = await trio.to_thread.run_sync(child.stdout.readline)
            assert line.startswith(b"ready " + tree.encode()), (line, tree)
            base = _status(child.pid, "VmRSS")
            started = time.monotonic()
            last, stalled_since = -1, time.monotonic()
            # Until the script is done, or the server could write nothing for
            # two seconds (the client reads no more), or a minute.
            while time.monotonic() - started < 60:
                await trio.sleep(0.1)
                sent = sum(c.sent_bytes for c in hostile.conns)
                if sent != last:
                    last, stalled_since = sent, time.monotonic()
                elif time.monotonic() - stalled_since > 2:
                    break
                if child.poll() is not None:
                    break
            alive = child.poll() is None
            peak = _status(child.pid, "VmHWM") if alive else 0
            return {
                "case": name,
                "alive": alive,
                "rss_at_start_mib": round(base / MiB, 1),
                "peak_rss_mib": round(peak / MiB, 1),
                "growth_mib": round((peak - base) / MiB, 1),
                "server_sent_mib": round(last / MiB, 1),
                "connections": len(hostile.conns),
                "seconds": round(time.monotonic() - started, 1),
            }
        finally:
            child.kill()
            await trio.to_thread.run_sync(child.wait)
            nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client-tree", default=str(HERE.parent), help="trionsq for the child")
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    selected = [c for c in args.only.split(",") if c] or list(cases())
    results = []
    for name in selected:
        script, server, options = cases()[name]
        result = trio.run(run_case, name, script, server, options, args.client_tree)
        results.append(result)
        print(
            f"{name:24} peak {result['peak_rss_mib']:8.1f} MiB "
            f"(+{result['growth_mib']:.1f} from {result['rss_at_start_mib']:.1f}); "
            f"server sent {result['server_sent_mib']:.1f} MiB over "
            f"{result['connections']} connection(s) in {result['seconds']} s; "
            f"client {'alive' if result['alive'] else 'DEAD'}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
