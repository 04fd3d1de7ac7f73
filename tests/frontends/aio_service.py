"""An asyncio service on trionsq.aio, stopped as docs/frontends.md says: the
first SIGINT or SIGTERM sets an event, the consumer leaves cleanly, the last
line says how many messages it handled (exit 0); a second signal aborts (130).

    python tests/frontends/aio_service.py NSQD_TCP_ADDRESS
"""

from __future__ import annotations

import asyncio
import sys

from trionsq import aio
from trionsq.stopping import EXIT_ABORTED, StopOnSignals


async def main(address: str) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    handled = 0

    async def handle(message: aio.Message) -> None:
        nonlocal handled
        handled += 1

    with StopOnSignals(lambda: loop.call_soon_threadsafe(stopping.set)) as signals:
        async with aio.Consumer(
            "jobs", "service", handler=handle, nsqd_tcp_addresses=[address]
        ) as consumer:
            await consumer.wait_connected()
            print("ready", flush=True)
            await stopping.wait()
    print(f"stopped cleanly on {signals.received} after {handled} message(s)", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(sys.argv[1])))
    except KeyboardInterrupt:
        print("aborted", flush=True)
        sys.exit(EXIT_ABORTED)
