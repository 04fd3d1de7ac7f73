"""IDENTIFY on nsqd's side: what a client may set for itself (nsqd's
``clientV2.Identify`` checks) and the features it is granted, with nsqd's
answer (:class:`~trionsq.protocol.identify.IdentifyResponse`).

The connection (:mod:`fakensq.nsqd.client`) reads the body, applies these,
answers, then upgrades its stream (TLS, then snappy or deflate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trionsq.protocol.errors import IdentifyFailedError
from trionsq.protocol.identify import IdentifyBody, IdentifyResponse

from .options import VERSION, NSQDOptions

__all__ = ["Features", "Negotiable", "apply_identify", "features", "identify_response"]


class Negotiable(Protocol):
    """A client's settings that IDENTIFY may change (seconds, bytes)."""

    heartbeat_interval: float
    output_buffer_size: int
    output_buffer_timeout: float
    sample_rate: int
    msg_timeout: float


def apply_identify(client: Negotiable, opts: NSQDOptions, data: IdentifyBody) -> None:
    """nsqd's ``clientV2.Identify``: each setting checked and set, in its order;
    ValueError (the rest of ``E_BAD_BODY IDENTIFY ...``) at the first it refuses."""
    hb = data.get("heartbeat_interval", 0)
    if hb == -1:
        client.heartbeat_interval = 0
    elif hb == 0:
        pass
    elif 1000 <= hb <= int(opts.max_heartbeat_interval * 1000):
        client.heartbeat_interval = hb / 1000
    else:
        raise ValueError(f"heartbeat interval ({hb}) is invalid")

    size = data.get("output_buffer_size", 0)
    timeout = data.get("output_buffer_timeout", 0)
    if timeout == -1:
        client.output_buffer_timeout = 0
    elif timeout == 0:
        pass
    elif (
        int(opts.min_output_buffer_timeout * 1000)
        <= timeout
        <= int(opts.max_output_buffer_timeout * 1000)
    ):
        client.output_buffer_timeout = timeout / 1000
    else:
        raise ValueError(f"output buffer timeout ({timeout}) is invalid")
    if size == -1:
        client.output_buffer_size = 1
        client.output_buffer_timeout = 0
    elif size == 0:
        pass
    elif 64 <= size <= opts.max_output_buffer_size:
        client.output_buffer_size = size
    else:
        raise ValueError(f"output buffer size ({size}) is invalid")

    rate = data.get("sample_rate", 0)
    if rate < 0 or rate > 99:
        raise ValueError(f"sample rate ({rate}) is invalid")
    client.sample_rate = rate

    msg_timeout = data.get("msg_timeout", 0)
    if msg_timeout == 0:
        pass
    elif 1000 <= msg_timeout <= int(opts.max_msg_timeout * 1000):
        client.msg_timeout = msg_timeout / 1000
    else:
        raise ValueError(f"msg timeout ({msg_timeout}) is invalid")


@dataclass(frozen=True)
class Features:
    """What the connection turns on after its answer."""

    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int

    @property
    def upgrades(self) -> bool:
        return self.tls_v1 or self.snappy or self.deflate


def features(opts: NSQDOptions, data: IdentifyBody, *, tls_available: bool) -> Features:
    """The features a client asked for that nsqd grants; IdentifyFailedError
    for both compressions at once."""
    deflate = opts.deflate and bool(data.get("deflate"))
    deflate_level = 6
    if deflate and data.get("deflate_level", 0) > 0:
        deflate_level = data["deflate_level"]
    snappy = opts.snappy and bool(data.get("snappy"))
    if deflate and snappy:
        raise IdentifyFailedError("cannot enable both deflate and snappy compression")
    return Features(
        tls_v1=tls_available and bool(data.get("tls_v1")),
        snappy=snappy,
        deflate=deflate,
        deflate_level=min(deflate_level, opts.max_deflate_level),
    )


def identify_response(
    opts: NSQDOptions, client: Negotiable, granted: Features, *, auth_required: bool
) -> IdentifyResponse:
    """nsqd's answer: its limits, the client's settings, the features granted."""
    return {
        "max_rdy_count": opts.max_rdy_count,
        "version": VERSION,
        "max_msg_timeout": int(opts.max_msg_timeout * 1000),
        "msg_timeout": int(client.msg_timeout * 1000),
        "tls_v1": granted.tls_v1,
        "deflate": granted.deflate,
        "deflate_level": granted.deflate_level,
        "max_deflate_level": opts.max_deflate_level,
        "snappy": granted.snappy,
        "sample_rate": client.sample_rate,
        "auth_required": auth_required,
        "output_buffer_size": client.output_buffer_size,
        "output_buffer_timeout": int(client.output_buffer_timeout * 1000),
    }
