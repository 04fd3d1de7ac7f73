"""http_publish and http_multi_publish: PRODUCER spans and the sent-messages
counter as the TCP publishes have, the HTTP endpoint as the server, nsqd's
refusal as the error; the trace context envelope with ``trace_context``. On
fakensq and the real nsqd v1.3.0."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from opentelemetry.trace import SpanKind, StatusCode

import trionsq
from trionsq.http import http_multi_publish, http_publish

from ..support.nodes import Daemons
from ..support.waiting import wait_until
from .conftest import Otel

TOPIC = "via_http"


async def test_http_publishes_are_producer_spans(daemons: Daemons, otel: Otel) -> None:
    nsqd = await daemons.nsqd()
    config = trionsq.Config(trace_context=True, **otel.options)
    address = nsqd.http_address
    await http_publish(address, TOPIC, b"one", config=config)
    await http_multi_publish(address, TOPIC, [b"two", b"three"], config=config)
    await http_publish(address, TOPIC, b"four", defer=0.01, config=config)
    with pytest.raises(trionsq.BadTopicError):
        await http_publish(address, "bad topic!", b"x", config=config)
    host, port = address.rsplit(":", 1)
    server = {"server.address": host, "server.port": int(port)}
    produced = otel.spans()
    assert [(s.name, s.kind) for s in produced] == [
        (f"publish {TOPIC}", SpanKind.PRODUCER),
        (f"multi_publish {TOPIC}", SpanKind.PRODUCER),
        (f"deferred_publish {TOPIC}", SpanKind.PRODUCER),
        ("publish bad topic!", SpanKind.PRODUCER),
    ]
    attributes = [dict(s.attributes or {}) for s in produced]
    for found, operation in zip(
        attributes, ["publish", "multi_publish", "deferred_publish", "publish"], strict=True
    ):
        assert (
            found.items()
            >= {
                "messaging.system": "nsq",
                "messaging.operation.type": "send",
                "messaging.operation.name": operation,
                **server,
            }.items()
        )
    assert attributes[1]["messaging.batch.message_count"] == 2
    assert attributes[2]["messaging.nsq.message.defer_delay"] == 0.01
    assert attributes[3]["error.type"] == "E_BAD_TOPIC"
    assert produced[3].status.status_code is StatusCode.ERROR
    sent = {
        (a["messaging.operation.name"], a["messaging.destination.name"], a.get("error.type")): v
        for a, v in otel.metrics()["messaging.client.sent.messages"]
    }
    assert sent == {
        ("publish", TOPIC, None): 1,
        ("multi_publish", TOPIC, None): 2,
        ("deferred_publish", TOPIC, None): 1,
        ("publish", "bad topic!", "E_BAD_TOPIC"): 1,
    }

    # the bodies went out enveloped: a consumer with trace_context links to them
    got: list[bytes] = []
    async with trionsq.Consumer(
        TOPIC,
        "chan",
        nsqd_tcp_addresses=[nsqd.tcp_address],
        handler=lambda m: got.append(m.body),
        max_in_flight=4,
        trace_context=True,
        **otel.options,
    ):
        await wait_until(lambda: len(otel.spans(f"process {TOPIC}")) == 4)
    assert sorted(got) == [b"four", b"one", b"three", b"two"]
    ids = {s.context.span_id for s in produced[:3] if s.context}
    linked = {s.links[0].context.span_id for s in otel.spans(f"process {TOPIC}")}
    assert linked == ids


async def test_an_unreachable_endpoint_is_an_error_span(otel: Otel) -> None:
    with trio.fail_after(20):
        with pytest.raises(Exception) as info:
            await http_publish("127.0.0.1:1", TOPIC, b"x", config=trionsq.Config(**otel.options))
    (span,) = otel.spans()
    found: dict[str, Any] = dict(span.attributes or {})
    assert span.status.status_code is StatusCode.ERROR
    assert found["error.type"] == type(info.value).__qualname__
    assert (found["server.address"], found["server.port"]) == ("127.0.0.1", 1)


async def test_nothing_is_recorded_without_an_sdk(daemons: Daemons) -> None:
    # No provider given, none set globally: the plain path (and no error).
    nsqd = await daemons.nsqd()
    await http_publish(nsqd.http_address, TOPIC, b"plain")
    await http_multi_publish(f"http://{nsqd.http_address}/", TOPIC, [b"a", b"b"])
    assert await nsqd.topic_depth(TOPIC) == 3
