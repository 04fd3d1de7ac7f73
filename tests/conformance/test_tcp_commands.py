"""Every TCP command in every connection state, with valid and invalid arguments.

Each case is a probe (:func:`.tcp.probe`): a connection is brought to a state
(fresh, identified, subscribed, a message in flight, closing), the command is
sent, and the outcome (its answer or error, whether the connection stays open,
the node's topics, channels and counts afterwards) is compared between fakensq
and the real nsqd.
"""

from __future__ import annotations

import pytest

from trionsq.protocol import commands as cmds

from .conftest import Conformance, Target
from .tcp import STATES, body, mpub_body, probe, size

ALL_STATES = list(STATES)

# Commands whose outcome depends on the connection state: tried in every state.
STATEFUL: dict[str, bytes] = {
    "identify": cmds.identify({"feature_negotiation": True}),
    "identify_plain": cmds.identify({"client_id": "x"}),
    "auth": cmds.auth("secret"),
    "sub": cmds.sub("t2", "ch"),
    "sub_same": cmds.sub("t", "ch"),
    "rdy": cmds.rdy(1),
    "rdy_no_count": b"RDY\n",
    "rdy_bad": b"RDY x\n",
    "fin": b"FIN {id}\n",
    "fin_unknown": cmds.fin(b"0123456789abcdef"),
    "fin_short": cmds.fin(b"1234"),
    "req": b"REQ {id} 0\n",
    "req_unknown": cmds.req(b"0123456789abcdef", 0),
    "touch": b"TOUCH {id}\n",
    "touch_unknown": cmds.touch(b"0123456789abcdef"),
    "cls": cmds.cls(),
    "nop": cmds.nop(),
    "pub": cmds.pub("probe", b"x"),
    "mpub": cmds.mpub("probe", [b"a", b"b"]),
    "dpub": cmds.dpub("probe", 1000, b"x"),
    "unknown": b"HELLO\n",
}


@pytest.mark.parametrize("state", ALL_STATES)
@pytest.mark.parametrize("command", list(STATEFUL))
async def test_command_in_state(conformance: Conformance, state: str, command: str) -> None:
    async def scenario(t: Target) -> object:
        return await probe(t, state, STATEFUL[command])

    await conformance.nsqd(scenario)


# Argument checks: tried on a subscribed connection with a message in flight
# (where FIN, REQ and TOUCH are allowed) and, for publishing, on a fresh one.
ARGUMENTS: dict[str, bytes] = {
    # SUB
    "sub_missing_channel": b"SUB t\n",
    "sub_no_params": b"SUB\n",
    "sub_extra_param": b"SUB t3 ch extra\n",
    "sub_bad_topic": b"SUB a*b ch\n",
    "sub_bad_channel": b"SUB t3 c*h\n",
    "sub_long_topic": b"SUB " + b"t" * 65 + b" ch\n",
    "sub_64_topic": b"SUB " + b"t" * 64 + b" ch\n",
    "sub_long_channel": b"SUB t3 " + b"c" * 65 + b"\n",
    "sub_ephemeral": b"SUB t3#ephemeral ch#ephemeral\n",
    "sub_bad_ephemeral": b"SUB t3 ch#ephemeralx\n",
    "sub_empty_topic": b"SUB  ch\n",
    # PUB
    "pub_no_topic": b"PUB\n" + body(b"x"),
    "pub_bad_topic": b"PUB a/b\n" + body(b"x"),
    "pub_extra_param": b"PUB probe extra\n" + body(b"x"),
    "pub_empty_body": b"PUB probe\n" + body(b""),
    "pub_negative_size": b"PUB probe\n" + b"\xff\xff\xff\xff",
    "pub_too_big": b"PUB probe\n" + size(1024 * 1024 + 1),
    "pub_max_size": b"PUB probe\n" + body(b"m" * 1024 * 1024),
    "pub_binary": b"PUB probe\n" + body(bytes(range(256))),
    "pub_crlf": b"PUB probe\r\n" + body(b"x"),
    "pub_ephemeral": b"PUB probe#ephemeral\n" + body(b"x"),
    # MPUB
    "mpub_one": b"MPUB probe\n" + mpub_body(b"a"),
    "mpub_no_topic": b"MPUB\n" + mpub_body(b"a"),
    "mpub_bad_topic": b"MPUB a!b\n" + mpub_body(b"a"),
    "mpub_zero_count": b"MPUB probe\n" + mpub_body(count=0),
    "mpub_negative_count": b"MPUB probe\n" + mpub_body(count=-1),
    "mpub_count_too_big": b"MPUB probe\n" + mpub_body(b"a", count=2),
    "mpub_huge_count": b"MPUB probe\n" + mpub_body(b"a", count=1_000_000_000),
    "mpub_empty_message": b"MPUB probe\n" + mpub_body(b"a", b""),
    "mpub_body_size_zero": b"MPUB probe\n" + body(b""),
    "mpub_body_too_big": b"MPUB probe\n" + size(5 * 1024 * 1024 + 1),
    "mpub_message_too_big": b"MPUB probe\n" + mpub_body(b"m" * (1024 * 1024 + 1)),
    "mpub_extra_bytes": b"MPUB probe\n" + body(mpub_body(b"a")[4:] + b"trailing"),
    # DPUB
    "dpub_zero": cmds.dpub("probe", 0, b"x"),
    "dpub_max": cmds.dpub("probe", 3600000, b"x"),
    "dpub_too_long": cmds.dpub("probe", 3600001, b"x"),
    "dpub_negative": b"DPUB probe -1\n" + body(b"x"),
    "dpub_not_a_number": b"DPUB probe soon\n" + body(b"x"),
    "dpub_missing_timeout": b"DPUB probe\n" + body(b"x"),
    "dpub_bad_topic": b"DPUB a:b 10\n" + body(b"x"),
    "dpub_empty_body": b"DPUB probe 10\n" + body(b""),
    "dpub_huge_timeout": b"DPUB probe 99999999999999999999\n" + body(b"x"),
    # RDY
    "rdy_zero": cmds.rdy(0),
    "rdy_max": cmds.rdy(2500),
    "rdy_over_max": cmds.rdy(2501),
    "rdy_negative": b"RDY -1\n",
    "rdy_huge": b"RDY 18446744073709551615\n",
    "rdy_overflow": b"RDY 18446744073709551616\n",
    "rdy_extra_param": b"RDY 1 2\n",
    "rdy_empty": b"RDY \n",
    # FIN
    "fin_no_id": b"FIN\n",
    "fin_long_id": b"FIN {id}0\n",
    "fin_extra_param": b"FIN {id} extra\n",
    "fin_twice": b"FIN {id}\nFIN {id}\n",
    # REQ
    # (long enough never to come due before the node's state is read, even on
    # a loaded machine: REQ delays coming due are test_tcp_timing's)
    "req_delay": b"REQ {id} 60000\n",
    "req_max_delay": b"REQ {id} 3600000\n",
    "req_too_long": b"REQ {id} 3600001\n",
    "req_negative": b"REQ {id} -1\n",
    "req_not_a_number": b"REQ {id} x\n",
    "req_no_timeout": b"REQ {id}\n",
    "req_short_id": b"REQ 1234 0\n",
    "req_twice": b"REQ {id} 0\nREQ {id} 0\n",
    "req_huge": b"REQ {id} 18446744073709551615\n",
    # TOUCH
    "touch_no_id": b"TOUCH\n",
    "touch_short_id": b"TOUCH 1234\n",
    "touch_twice": b"TOUCH {id}\nTOUCH {id}\n",
    "touch_then_fin": b"TOUCH {id}\nFIN {id}\n",
    # CLS, NOP and the rest
    "cls_extra_param": b"CLS now\n",
    "cls_twice": b"CLS\nCLS\n",
    "nop_extra_param": b"NOP x\n",
    "lowercase": b"pub probe\n" + body(b"x"),
    "empty_line": b"\n",
    "space_line": b" \n",
    "crlf_nop": b"NOP\r\n",
    "nul": b"\x00\n",
    "identify_no_body_size": b"IDENTIFY\n",
}


# Commands that announce more than they send: nsqd reads the next command's
# bytes as their rest.
INCOMPLETE = {"mpub_count_too_big"}


@pytest.mark.parametrize("state", ["in_flight"])
@pytest.mark.parametrize("command", list(ARGUMENTS))
async def test_arguments(conformance: Conformance, state: str, command: str) -> None:
    async def scenario(t: Target) -> object:
        return await probe(t, state, ARGUMENTS[command], wait_answer=command not in INCOMPLETE)

    await conformance.nsqd(scenario)
