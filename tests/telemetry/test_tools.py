"""The tools unwrap the trace context envelope when told to
(``--consumer-opt=trace_context=true``), to-nsq writes it on its copies when
told to (``--output-trace-context``), on fakensq and the real nsqd."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trionsq import blocking
from trionsq.tracecontext import MAGIC, Unwrapped, unwrap, wrap

from ..support.nodes import BlockingNode
from ..support.waiting import wait_until_blocking
from ..tools.helpers import drained, publish, run_tool, stop_tool, track

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("option", [True, False])
def test_tail_unwraps_when_told(daemon: BlockingNode, option: bool) -> None:
    bodies = [wrap(b"one", PARENT, "k=v"), wrap(b"two"), MAGIC + b"\x01\x37short", b"plain"]
    publish(daemon.http_address, "traced", bodies)
    args = ["--topic", "traced", "-n", "4", "--nsqd-tcp-address", daemon.tcp_address]
    if option:
        args.append("--consumer-opt=trace_context=true")
    tail = run_tool("tail", *args)
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.split(b"\n")[:-1]  # each body, then a newline
    if option:
        # bodies it cannot unwrap are printed whole, and said on stderr
        assert lines == [b"one", b"two", MAGIC + b"\x01\x37short", b"plain"]
        assert b"truncated" in tail.stderr
    else:
        assert lines == bodies


#: ``trionsq ARGS`` with a global SDK in the tool's process; its spans are
#: printed as JSON lines once the tool has ended
TOOL_WITH_SDK = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
from trionsq import cli

status = cli.main(sys.argv[1:])
for span in exporter.get_finished_spans():
    context = span.context
    print("SPAN " + json.dumps({
        "name": span.name,
        "kind": span.kind.name,
        "ids": f"{context.trace_id:032x}-{context.span_id:016x}",
        "links": [f"{l.context.trace_id:032x}-{l.context.span_id:016x}" for l in span.links],
    }))
sys.exit(status)
"""


def test_to_nsq_writes_the_envelope_keeping_the_inputs_context(daemon: BlockingNode) -> None:
    """--output-trace-context: each copy is enveloped; a message that came
    with a context keeps it, the others get the copy's publish span's; that
    span links to the contexts its batch came with; the input is unwrapped
    (no envelope inside an envelope)."""
    bodies = [wrap(b"one", PARENT, "k=v"), b"plain", wrap(b"no context")]
    publish(daemon.http_address, "traced_in", bodies)
    tool = track(
        subprocess.Popen(
            [sys.executable, "-c", TOOL_WITH_SDK, "to-nsq", "--topic=traced_in",
             f"--nsqd-tcp-address={daemon.tcp_address}", "--destination-topic=traced_out",
             f"--destination-nsqd-tcp-address={daemon.tcp_address}", "--output-trace-context"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    )  # fmt: skip
    wait_until_blocking(
        lambda: drained(daemon.http_address, "traced_in", "nsq_to_nsq", 3), what="copied"
    )
    status, out, err = stop_tool(tool)
    assert status == 0, err
    spans = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("SPAN ")]
    published = [s for s in spans if s["kind"] == "PRODUCER"]
    assert published and all(s["name"].endswith(" traced_out") for s in published)
    # the publish span links to the context "one" came with
    trace_and_span = PARENT.split("-")[1] + "-" + PARENT.split("-")[2]
    assert [trace_and_span] == [link for s in published for link in s["links"]]
    ours = {s["ids"] for s in published}
    copies: dict[bytes, Unwrapped] = {}
    with blocking.Consumer(
        "traced_out", "check", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=3
    ) as consumer:
        for message in consumer:
            found = unwrap(message.body)
            copies[found.body] = found
            message.finish()
            if len(copies) == 3:
                break
    assert sorted(copies) == [b"no context", b"one", b"plain"]
    assert all(found.problem is None for found in copies.values())
    assert (copies[b"one"].traceparent, copies[b"one"].tracestate) == (PARENT, "k=v")
    for body in (b"plain", b"no context"):
        assert copies[body].traceparent.split("-", 1)[1].rsplit("-", 1)[0] in ours
