"""HTTP outcomes to compare: what a client of nsqd's or nsqlookupd's HTTP API sees.

:func:`outcome` reduces a response to its status, the headers a client may act
on and its body (JSON parsed, so that key order is compared too; text as it is;
binary bodies by type and size).  :func:`raw` sends bytes as they are on a new
connection (for what an HTTP client library would not send: bad escapes, paths
it cleans, missing headers) and parses the answer with h11.

:func:`state` is the part of ``/stats`` a request can change (topics, channels,
depths, pause flags), so that a scenario compares the side effects of a request
as well as its answer.
"""

from __future__ import annotations

from typing import Any

import h11
import httpx
import trio

from trionsq.transport import parse_address

from ..support.waiting import poll_until
from .session import READ_TIMEOUT

__all__ = [
    "HEADERS",
    "outcome",
    "raw",
    "request",
    "state",
    "unsettled",
    "settled",
    "mask_text_stats",
    "mask_pprof_index",
]

#: The response headers a client may act on (the rest, such as Date, vary).
HEADERS = (
    "content-type",
    "x-nsq-content-type",
    "allow",
    "location",
    "content-disposition",
    "x-content-type-options",
    "x-go-pprof",
    "connection",
)


def outcome(response: httpx.Response, *, body: bool = True) -> tuple[Any, ...]:
    """``(status, headers that matter, body)`` of a response (module doc)."""
    headers = {name: response.headers[name] for name in HEADERS if name in response.headers}
    ctype = response.headers.get("content-type", "")
    if "content-length" in response.headers and not ctype.startswith(
        ("application/json", "application/octet-stream")
    ):
        # (a JSON body's length varies with the ports and times it holds; a
        # profile's with the process)
        headers["content-length"] = response.headers["content-length"]
    headers = dict(sorted(headers.items()))  # header order carries no meaning
    payload: Any = None
    if body:
        if not response.content:
            payload = b""
        elif ctype.startswith("application/json"):
            payload = ("json", response.json())
        elif ctype.startswith("application/octet-stream"):
            payload = ("binary", response.content[:2] == b"\x1f\x8b")  # gzipped or not
        else:
            payload = response.content
    return (response.status_code, headers, payload)


async def request(
    http: httpx.AsyncClient, method: str, path: str, content: bytes | None = None
) -> tuple[Any, ...]:
    """:func:`outcome` of one request."""
    return outcome(await http.request(method, path, content=content))


async def raw(address: str, data: bytes) -> tuple[Any, ...]:
    """Send ``data`` on a new connection; ``(status, headers, body, closed)`` of
    the first answer (``closed``: the server closed the connection after it)."""
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port)
    conn = h11.Connection(h11.CLIENT)
    # h11 must think it sent a request to parse the answer.
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    status = 0
    headers: dict[str, str] = {}
    body = bytearray()
    closed = False
    try:
        with trio.fail_after(READ_TIMEOUT):
            await stream.send_all(data)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        chunk = await stream.receive_some(65536)
                    except trio.BrokenResourceError:
                        chunk = b""
                    conn.receive_data(bytes(chunk))
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                    for name, value in event.headers:
                        key = name.decode().lower()
                        if key in HEADERS or key == "content-length":
                            headers[key] = value.decode()
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
            # Did the server close after answering?
            with trio.move_on_after(0.5):
                try:
                    closed = not await stream.receive_some(1)
                except trio.BrokenResourceError:
                    closed = True
    finally:
        await trio.aclose_forcefully(stream)
    return (status, dict(sorted(headers.items())), bytes(body), closed)


def unsettled(topic: dict[str, Any]) -> bool:
    """A topic whose pump still has messages to move: not paused, with channels,
    yet holding messages (nsqd moves them to the channels in a goroutine of the
    topic's own, a moment after the request that put them there answered)."""
    return bool(topic["channels"]) and not topic["paused"] and topic["depth"] > 0


def settled(stats: dict[str, Any]) -> bool:
    """No topic in a ``/stats`` document is :func:`unsettled`."""
    return not any(unsettled(t) for t in stats["topics"] or [])


async def state(http: httpx.AsyncClient) -> list[Any]:
    """What requests change, from ``/stats``: each topic's name, pause flag,
    depth and message count, and its channels' (name, paused, depth).

    Read once every topic's pump has settled (:func:`settled`), so that the
    real nsqd and fakensq are compared at rest, not at whichever moment the
    read happened to fall."""

    async def read() -> Any:
        r = await http.get("/stats", params={"format": "json", "include_clients": "false"})
        return r.json()

    doc = await poll_until(read, settled, "every topic's pump to settle (/stats)")
    return [
        (
            t["topic_name"],
            t["paused"],
            t["depth"],
            t["message_count"],
            [(c["channel_name"], c["paused"], c["depth"]) for c in t["channels"]],
        )
        for t in doc["topics"] or []
    ]


def mask_text_stats(text: str) -> str:
    """The text ``/stats`` with what varies run to run masked: the start time,
    the uptime, memory figures and connection durations; and the version line's
    build note (``built w/go1.27.3`` for nsqd, fakensq's release for fakensq)."""
    import re

    lines = []
    for line in text.split("\n"):
        if re.fullmatch(r"nsqd v\S+ \(.*\)", line):
            # The build note: Go's toolchain, or fakensq's (never a Go build).
            line = re.sub(r"\(.*\)", "(<build>)", line)
        elif line.startswith("start_time "):
            line = "start_time <time>"
        elif line.startswith("uptime "):
            line = "uptime <duration>"
        elif (
            line.startswith("   ")
            and "\t" in line
            and line.strip()
            .split()[0]
            .endswith(("_objects", "_bytes", "_100", "_99", "_95", "_runs"))
        ):
            line = re.sub(r"\t\d+$", "\t<n>", line)
        line = re.sub(r"connected: \S+$", "connected: <duration>", line)
        # a client's "hostname:port", the port its own
        line = re.sub(r"^(\s+\[V2 [^ ]*):\d+ ", r"\1:<port> ", line)
        lines.append(line)
    return "\n".join(lines)


def mask_pprof_index(body: bytes) -> bytes:
    """The ``/debug/pprof`` index with its counts (of goroutines, threads...)
    masked: those are the process's own."""
    import re

    return re.sub(rb"<tr><td>\d+</td>", b"<tr><td>n</td>", body)
