"""A FastAPI app consuming an NSQ topic for as long as it runs (in its lifespan).

The asyncio Consumer lives in the app's lifespan: it starts with the app, hands
every message to an async handler on the app's own event loop, and stops with
it (promptly, requeueing what it had not finished).  The routes show what came.

    NSQD_TCP_ADDRESSES=127.0.0.1:4150 uvicorn examples.fastapi_consume:app
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from trionsq import aio


def create_app(
    nsqd_tcp_addresses: list[str] | None = None,
    topic: str = "events",
    channel: str = "dashboard",
) -> FastAPI:
    addresses = nsqd_tcp_addresses or os.environ.get("NSQD_TCP_ADDRESSES", "127.0.0.1:4150").split(
        ","
    )
    recent: deque[str] = deque(maxlen=100)

    async def handle(message: aio.Message) -> None:
        # Returning finishes the message; raising would requeue it (with backoff).
        recent.append(message.body.decode(errors="replace"))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with aio.Consumer(
            topic, channel, nsqd_tcp_addresses=addresses, handler=handle, max_in_flight=50
        ) as consumer:
            app.state.consumer = consumer
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/recent")
    async def get_recent() -> list[str]:
        return list(recent)

    @app.get("/stats")
    async def get_stats() -> dict[str, Any]:
        stats = app.state.consumer.stats
        return {"received": stats.received, "finished": stats.finished}

    return app


app = create_app()
