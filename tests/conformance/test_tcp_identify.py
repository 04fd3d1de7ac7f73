"""IDENTIFY: every feature and bound, compared between fakensq and the real nsqd.

A scenario identifies with some fields, then (when nsqd accepted them) proves
the connection works as negotiated: it subscribes, a message published on
another connection arrives through the negotiated stream (TLS, snappy,
deflate), and the client's entry in ``/stats`` shows what nsqd kept of the
IDENTIFY (client_id, hostname, user_agent, sample_rate, compression, TLS).
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import pytest
import trio

from trionsq.protocol import commands as cmds

from ..support.tls import Pki
from .conftest import Conformance, Target
from .session import READ_TIMEOUT, Session
from .tcp import body, settled_stats


def client_view(doc: Any, session: Session) -> Any:
    """The ``/stats`` entry of ``session``'s connection (None when not subscribed)."""
    for topic in doc["topics"]:
        for channel in topic["channels"]:
            for client in channel["clients"]:
                if client["remote_address"] == session.local_address:
                    return client
    return None


async def identify_and_use(t: Target, fields: dict[str, Any], **kwargs: Any) -> Any:
    c = await t.connect()
    answer = await c.identify(**fields, **kwargs)
    if c.closed:
        return None
    await c.sub("t", "ch", rdy=1)
    # Sampling drops messages at random, except at 99 (nsqd keeps a message
    # unless a draw in 0..99 exceeds the rate).
    if fields.get("sample_rate", 0) in (0, 99):
        p = await t.connect("p")
        if kwargs.get("ssl_context") is not None:  # (nsqd may require TLS to publish)
            await p.identify(feature_negotiation=True, tls_v1=True, **kwargs)
        await p.call(cmds.pub("t", b"through the negotiated stream"))
        await c.read_messages(1)
    else:
        # RDY has no answer: give nsqd time to apply it (on a loaded machine
        # /stats can come first), then compare whatever it shows.
        with trio.move_on_after(READ_TIMEOUT):
            while not c.closed:
                view = client_view(await t.stats(), c)
                if view is None or view["ready_count"] == 1:
                    break
                await trio.sleep(0.005)  # another process's state: poll it
    if c.closed:
        return None
    view = client_view(await settled_stats(t), c)
    del answer
    return view


# Field values around each bound nsqd checks (its defaults: heartbeat up to 60 s,
# output buffer 64 B..64 KiB, its timeout 25 ms..30 s... msg_timeout 1 s..15 min).
CASES: dict[str, dict[str, Any]] = {
    "empty": {},
    "negotiation_off": {"feature_negotiation": False, "client_id": "a", "hostname": "h"},
    "negotiation_on": {"feature_negotiation": True},
    "client_id_hostname": {"feature_negotiation": True, "client_id": "cid", "hostname": "hn"},
    "short_long_id": {"feature_negotiation": True, "short_id": "s", "long_id": "l"},
    "ids_both": {"client_id": "cid", "short_id": "s", "hostname": "h", "long_id": "l"},
    "user_agent": {"feature_negotiation": True, "user_agent": "conformance/1.0"},
    "unknown_fields": {"feature_negotiation": True, "colour": "blue", "x": [1, {"y": None}]},
    "upper_case_keys": {"FEATURE_NEGOTIATION": True, "Client_ID": "upper", "USER_AGENT": "UA"},
    "nulls": {"feature_negotiation": True, "client_id": None, "heartbeat_interval": None},
    "heartbeat_off": {"feature_negotiation": True, "heartbeat_interval": -1},
    "heartbeat_zero": {"feature_negotiation": True, "heartbeat_interval": 0},
    "heartbeat_999": {"feature_negotiation": True, "heartbeat_interval": 999},
    "heartbeat_1000": {"feature_negotiation": True, "heartbeat_interval": 1000},
    "heartbeat_max": {"feature_negotiation": True, "heartbeat_interval": 60000},
    "heartbeat_over_max": {"feature_negotiation": True, "heartbeat_interval": 60001},
    "heartbeat_minus_2": {"feature_negotiation": True, "heartbeat_interval": -2},
    "buffer_size_off": {"feature_negotiation": True, "output_buffer_size": -1},
    "buffer_size_zero": {"feature_negotiation": True, "output_buffer_size": 0},
    "buffer_size_63": {"feature_negotiation": True, "output_buffer_size": 63},
    "buffer_size_64": {"feature_negotiation": True, "output_buffer_size": 64},
    "buffer_size_max": {"feature_negotiation": True, "output_buffer_size": 65536},
    "buffer_size_over_max": {"feature_negotiation": True, "output_buffer_size": 65537},
    "buffer_size_minus_2": {"feature_negotiation": True, "output_buffer_size": -2},
    "buffer_timeout_off": {"feature_negotiation": True, "output_buffer_timeout": -1},
    "buffer_timeout_zero": {"feature_negotiation": True, "output_buffer_timeout": 0},
    "buffer_timeout_1": {"feature_negotiation": True, "output_buffer_timeout": 1},
    "buffer_timeout_24": {"feature_negotiation": True, "output_buffer_timeout": 24},
    "buffer_timeout_25": {"feature_negotiation": True, "output_buffer_timeout": 25},
    "buffer_timeout_max": {"feature_negotiation": True, "output_buffer_timeout": 30000},
    "buffer_timeout_over_max": {"feature_negotiation": True, "output_buffer_timeout": 30001},
    "buffer_both_off": {
        "feature_negotiation": True,
        "output_buffer_size": -1,
        "output_buffer_timeout": -1,
    },
    "buffer_size_off_timeout_set": {
        "feature_negotiation": True,
        "output_buffer_size": -1,
        "output_buffer_timeout": 100,
    },
    "buffer_timeout_bad_size_bad": {
        "feature_negotiation": True,
        "output_buffer_size": 1,
        "output_buffer_timeout": 1,
    },
    "sample_rate_zero": {"feature_negotiation": True, "sample_rate": 0},
    "sample_rate_1": {"feature_negotiation": True, "sample_rate": 1},
    "sample_rate_99": {"feature_negotiation": True, "sample_rate": 99},
    "sample_rate_100": {"feature_negotiation": True, "sample_rate": 100},
    "sample_rate_negative": {"feature_negotiation": True, "sample_rate": -1},
    "msg_timeout_zero": {"feature_negotiation": True, "msg_timeout": 0},
    "msg_timeout_999": {"feature_negotiation": True, "msg_timeout": 999},
    "msg_timeout_1000": {"feature_negotiation": True, "msg_timeout": 1000},
    "msg_timeout_max": {"feature_negotiation": True, "msg_timeout": 900000},
    "msg_timeout_over_max": {"feature_negotiation": True, "msg_timeout": 900001},
    "msg_timeout_negative": {"feature_negotiation": True, "msg_timeout": -1},
    "snappy": {"feature_negotiation": True, "snappy": True},
    "snappy_without_negotiation": {"snappy": True},
    "deflate": {"feature_negotiation": True, "deflate": True},
    "deflate_level_1": {"feature_negotiation": True, "deflate": True, "deflate_level": 1},
    "deflate_level_6": {"feature_negotiation": True, "deflate": True, "deflate_level": 6},
    "deflate_level_9": {"feature_negotiation": True, "deflate": True, "deflate_level": 9},
    "deflate_level_0": {"feature_negotiation": True, "deflate": True, "deflate_level": 0},
    "deflate_level_negative": {"feature_negotiation": True, "deflate": True, "deflate_level": -3},
    "deflate_level_without_deflate": {"feature_negotiation": True, "deflate_level": 3},
    "deflate_and_snappy": {"feature_negotiation": True, "deflate": True, "snappy": True},
    "tls_without_certificates": {"feature_negotiation": True, "tls_v1": True},
    "every_bound_at_once": {
        "feature_negotiation": True,
        "heartbeat_interval": 1000,
        "output_buffer_size": 64,
        "output_buffer_timeout": 25,
        "sample_rate": 99,
        "msg_timeout": 1000,
        "user_agent": "all",
    },
    "first_bad_wins": {
        "feature_negotiation": True,
        "heartbeat_interval": 1,
        "output_buffer_size": 1,
        "sample_rate": 100,
        "msg_timeout": 1,
    },
}


@pytest.mark.parametrize("case", list(CASES))
async def test_identify_fields(conformance: Conformance, case: str) -> None:
    async def scenario(t: Target) -> Any:
        return await identify_and_use(t, CASES[case])

    await conformance.nsqd(scenario)


# Bodies Go's encoding/json takes or refuses (nsqd decodes into a struct).
BODIES: dict[str, bytes] = {
    "not_json": b"{nope",
    "array": b"[1, 2]",
    "string": b'"text"',
    "number": b"42",
    "null": b"null",
    "empty_object": b"{}",
    "trailing_garbage": b'{"client_id": "a"} x',
    "float_for_int": b'{"heartbeat_interval": 1000.5}',
    "float_integral": b'{"heartbeat_interval": 1000.0}',
    "exponent": b'{"msg_timeout": 1e3}',
    "string_for_int": b'{"sample_rate": "5"}',
    "int_for_string": b'{"client_id": 5}',
    "int_for_bool": b'{"feature_negotiation": 1}',
    "string_for_bool": b'{"snappy": "true"}',
    "huge_int": b'{"heartbeat_interval": 99999999999999999999}',
    "int32_overflow": b'{"sample_rate": 4294967296}',
    "duplicate_keys": b'{"client_id": "a", "client_id": "b", "feature_negotiation": true}',
    "unicode": '{"client_id": "h\u00e9", "user_agent": "\u2603"}'.encode(),
    "escaped": b'{"client_id": "a\\u0062\\n"}',
    "invalid_utf8": b'{"client_id": "\xff\xfe"}',
    "nested_unknown": b'{"meta": {"a": [1, 2, {"b": null}]}, "feature_negotiation": true}',
    "whitespace": b' \n { "feature_negotiation" : true } \n',
    "nan": b'{"heartbeat_interval": NaN}',
    "negative_zero": b'{"sample_rate": -0}',
    "bool_null_mix": b'{"tls_v1": null, "snappy": false, "deflate": null}',
}


@pytest.mark.parametrize("case", list(BODIES))
async def test_identify_json_bodies(conformance: Conformance, case: str) -> None:
    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.send(b"IDENTIFY\n" + body(BODIES[case]))
        await c.read(1)
        if not c.closed:
            await c.sync()
        return None

    await conformance.nsqd(scenario)


@pytest.mark.parametrize(
    ("flags", "fields"),
    [
        (["--snappy=false"], {"snappy": True}),
        (["--deflate=false"], {"deflate": True}),
        (["--max-deflate-level=3"], {"deflate": True}),
        (["--max-deflate-level=3"], {"deflate": True, "deflate_level": 9}),
        (["--max-deflate-level=9"], {"deflate": True, "deflate_level": 9}),
        (["--max-deflate-level=1"], {"deflate": True, "deflate_level": 1}),
        (["--max-heartbeat-interval=5s"], {"heartbeat_interval": 5001}),
        (["--max-heartbeat-interval=5s"], {"heartbeat_interval": 5000}),
        (["--max-output-buffer-size=100"], {"output_buffer_size": 101}),
        (["--max-output-buffer-timeout=100ms"], {"output_buffer_timeout": 101}),
        (["--min-output-buffer-timeout=50ms"], {"output_buffer_timeout": 49}),
        (["--output-buffer-timeout=100ms"], {}),
        (["--max-msg-timeout=2s"], {"msg_timeout": 2001}),
        (["--msg-timeout=2s"], {}),
        (["--max-rdy-count=10"], {}),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else json.dumps(v),
)
async def test_identify_with_node_options(
    conformance: Conformance, flags: list[str], fields: dict[str, Any]
) -> None:
    async def scenario(t: Target) -> Any:
        return await identify_and_use(t, {"feature_negotiation": True, **fields})

    await conformance.nsqd(scenario, *flags)


# --- TLS ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(pki: Pki) -> dict[str, Any]:
    """A CA, a server certificate for 127.0.0.1, and a client certificate."""
    return {
        "cert": pki.cert,
        "key": pki.key,
        "ca": pki.ca_file,
        "client_cert": pki.client_pem("conformance-client"),
    }


def client_context(
    tls: dict[str, Any], *, cert: bool = False, maximum: ssl.TLSVersion | None = None
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=tls["ca"])
    if cert:
        ctx.load_cert_chain(tls["client_cert"])
    if maximum is not None:
        ctx.maximum_version = maximum
    return ctx


def tls_flags(tls: dict[str, Any], *extra: str) -> list[str]:
    return [f"--tls-cert={tls['cert']}", f"--tls-key={tls['key']}", *extra]


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        ([], {"tls_v1": True}),
        ([], {"tls_v1": False}),
        ([], {"tls_v1": True, "snappy": True}),
        ([], {"tls_v1": True, "deflate": True, "deflate_level": 2}),
        (["--tls-min-version=tls1.2"], {"tls_v1": True}),
        (["--tls-required=true"], {"tls_v1": True}),
        (["--tls-required=tcp-https"], {"tls_v1": True}),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else json.dumps(v),
)
async def test_identify_tls(
    conformance: Conformance, tls_files: dict[str, Any], extra: list[str], fields: dict[str, Any]
) -> None:
    async def scenario(t: Target) -> Any:
        return await identify_and_use(
            t, {"feature_negotiation": True, **fields}, ssl_context=client_context(tls_files)
        )

    await conformance.nsqd(scenario, *tls_flags(tls_files, *extra))


@pytest.mark.parametrize("maximum", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
async def test_tls_version_and_cipher_suite(
    conformance: Conformance, tls_files: dict[str, Any], maximum: ssl.TLSVersion
) -> None:
    # nsqd picks the suite (Go's order); /stats names it as nsqd's table does.
    async def scenario(t: Target) -> Any:
        ctx = client_context(tls_files, maximum=maximum)
        view = await identify_and_use(
            t, {"feature_negotiation": True, "tls_v1": True}, ssl_context=ctx
        )
        stream = t.sessions[0].stream
        assert isinstance(stream, trio.SSLStream)
        return view, stream.cipher(), stream.version()

    await conformance.nsqd(scenario, *tls_flags(tls_files))


@pytest.mark.parametrize(
    "command",
    [cmds.sub("t", "ch"), cmds.pub("t", b"x"), cmds.nop(), cmds.rdy(1), b"AUTH\n" + body(b"s")],
    ids=["sub", "pub", "nop", "rdy", "auth"],
)
async def test_tls_required_refuses_plain_commands(
    conformance: Conformance, tls_files: dict[str, Any], command: bytes
) -> None:
    async def scenario(t: Target) -> None:
        c = await t.connect()
        await c.send(command)
        await c.read_until_closed()

    await conformance.nsqd(scenario, *tls_flags(tls_files, "--tls-required=true"))


async def test_tls_required_identify_without_tls(
    conformance: Conformance, tls_files: dict[str, Any]
) -> None:
    async def scenario(t: Target) -> None:
        c = await t.connect()
        await c.identify(feature_negotiation=True)  # no tls_v1: answered, then refused
        await c.send(cmds.sub("t", "ch"))
        await c.read_until_closed()

    await conformance.nsqd(scenario, *tls_flags(tls_files, "--tls-required=true"))


@pytest.mark.parametrize("policy", ["require", "require-verify"])
@pytest.mark.parametrize("with_cert", [True, False])
async def test_tls_client_auth_policy(
    conformance: Conformance, tls_files: dict[str, Any], policy: str, with_cert: bool
) -> None:
    async def scenario(t: Target) -> Any:
        c = await t.connect()
        try:
            await c.identify(
                feature_negotiation=True,
                tls_v1=True,
                ssl_context=client_context(tls_files, cert=with_cert),
            )
        except ssl.SSLError as exc:
            return f"TLS refused: {exc.reason}"
        if c.closed:
            return "closed"
        await c.sync()
        return "open"

    extra = [f"--tls-client-auth-policy={policy}", f"--tls-root-ca-file={tls_files['ca']}"]
    await conformance.nsqd(scenario, *tls_flags(tls_files, *extra))


@pytest.mark.parametrize(
    "fields",
    [
        {"snappy": True},
        {"deflate": True, "deflate_level": 1},
        {"deflate": True, "deflate_level": 9},
    ],
    ids=["snappy", "deflate-1", "deflate-9"],
)
async def test_large_messages_through_compression(
    conformance: Conformance, fields: dict[str, Any]
) -> None:
    # Bodies beyond snappy's 64 KiB chunks and deflate's windows, both ways.
    big = bytes(range(256)) * 2000 + b"z" * 300_000

    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.identify(feature_negotiation=True, **fields)
        await c.call(cmds.pub("t", big))
        await c.call(cmds.mpub("t", [big[:70_000], big[70_000:200_000]]))
        await c.sub("t", "ch", rdy=3)
        got = await c.read_messages(3)
        del t.transcript[-3:]
        return [len(m.body) for m in got], got[0].body == big

    await conformance.nsqd(scenario)
