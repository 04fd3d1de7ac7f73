"""The tools unwrap the trace context envelope when told to
(``--consumer-opt=trace_context=true``), on fakensq and the real nsqd."""

from __future__ import annotations

import pytest

from trionsq.tracecontext import MAGIC, wrap

from ..support.nodes import BlockingNode
from ..tools.helpers import publish, run_tool

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
