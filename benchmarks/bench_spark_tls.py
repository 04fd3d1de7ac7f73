"""What the source's TLS costs a replay: one set's rows fetched over loopback,
through the source's own framing, in plain TCP and in TLS (the query's key), in
the same process, alternately.

A replay (a retried or speculative task reading a set another executor's agent
holds) is the only time message bodies travel between the source's processes
over TCP; the coordinator's frames are a few hundred bytes.

    python benchmarks/bench_spark_tls.py [--mib 16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trionsq.spark import _framing as framing
from trionsq.spark import _secure
from trionsq.spark._secure import QueryKeys


async def fetch(keys: QueryKeys, payload: bytes, tls: bool) -> float:
    """Seconds from connecting to holding the whole answer."""

    async def serve(stream: trio.SocketStream) -> None:
        peer: trio.abc.Stream = stream
        if tls:
            peer = await _secure.accept(stream, keys.server_context())
        await framing.receive(peer, framing.Limits(4096))
        await framing.send(peer, {"rows": 1}, payload)
        await trio.aclose_forcefully(peer)

    async with trio.open_nursery() as nursery:
        server = functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1")
        listeners = await nursery.start(server)
        port = listeners[0].socket.getsockname()[1]
        began = time.perf_counter()
        stream: trio.abc.Stream
        if tls:
            stream = await _secure.connect("127.0.0.1", port, keys.client_context())
        else:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        await framing.send(stream, {"op": "fetch"})
        _, got = await framing.receive(stream, framing.Limits(4096, len(payload)))
        elapsed = time.perf_counter() - began
        assert got == payload
        await trio.aclose_forcefully(stream)
        nursery.cancel_scope.cancel()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=16, help="the set's rows, in MiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    keys = QueryKeys.new()
    payload = bytes(range(256)) * (args.mib << 12)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for tls in (False, True):
            times[tls].append(trio.run(fetch, keys, payload, tls))
    plain, secure = statistics.median(times[False]), statistics.median(times[True])
    print(f"one replay of {args.mib} MiB over loopback, median of {args.rounds}:")
    print(f"  plain TCP  {plain * 1000:7.1f} ms  {args.mib / plain:6.0f} MiB/s")
    print(f"  TLS 1.3    {secure * 1000:7.1f} ms  {args.mib / secure:6.0f} MiB/s")
    print(f"  TLS / plain: {secure / plain:.2f} x the time")


if __name__ == "__main__":
    main()
