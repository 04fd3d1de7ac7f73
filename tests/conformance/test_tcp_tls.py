"""TLS on the TCP protocol: which clients nsqd lets in, and what the others see.

nsqd's ``--tls-client-auth-policy`` is Go's ``tls.ClientAuthType``:
``require`` wants any certificate (never verified, even with
``--tls-root-ca-file``), ``require-verify`` wants one that verifies against the
root CA file (or the system's roots without one), anything else asks for none;
any policy also makes ``--tls-required`` true.  Each configuration below is met
by clients with no certificate, one from the root CA, one from another CA, over
TLS 1.2 and 1.3, and by a client that does not ask for TLS.  A refused client
reads Go's alert: in TLS 1.2 during the handshake, in TLS 1.3 (where the
client's handshake is over first) on its first read.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import pytest
import trio

from trionsq.protocol import commands as cmds

from ..support.authserver import AuthServer
from ..support.tls import Pki
from .conftest import Conformance, Target
from .session import READ_TIMEOUT
from .tcp import body

VERSIONS = {"tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3}


@pytest.fixture(scope="module")
def certs(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A root CA with a server and a client certificate, and a client
    certificate from another CA (its common names are what nsqd tells the
    auth server)."""
    other = Pki(tmp_path_factory.mktemp("other-pki"))
    return {
        "cert": pki.cert,
        "key": pki.key,
        "ca": pki.ca_file,
        "client": pki.client_pem("client.example", "root-ca-client"),
        "other": other.client_pem("stranger.example", "other-ca-client"),
    }


def client_ssl(certs: dict[str, str], cert: str, version: str) -> ssl.SSLContext:
    """A client that trusts nsqd's certificate, presenting ``cert`` ("" none)."""
    ctx = ssl.create_default_context(cafile=certs["ca"])
    ctx.maximum_version = VERSIONS[version]
    if cert:
        ctx.load_cert_chain(certs[cert])
    return ctx


def _why(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLError):
        return f"{type(cause).__name__} {cause.reason}"
    return type(exc).__name__


async def _read_frame(stream: trio.abc.Stream, buffer: bytearray) -> bytes | None:
    """One frame's type and data (None at EOF); raises BrokenResourceError."""
    while True:
        if len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if len(buffer) >= 4 + size:
                frame = bytes(buffer[4 : 4 + size])
                del buffer[: 4 + size]
                return frame
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data


async def tls_client(t: Target, ctx: ssl.SSLContext | None) -> str:
    """IDENTIFY (with tls_v1 when ``ctx`` is given), then SUB: what happened."""
    c = await t.connect()
    answer = await c.call(cmds.identify({"feature_negotiation": True, "tls_v1": ctx is not None}))
    offered = answer[0][1] == "json" and answer[0][2]["tls_v1"]
    stream: trio.abc.Stream = c.stream
    if ctx is not None and offered:
        tls = trio.SSLStream(stream, ctx, server_hostname="127.0.0.1")
        try:
            with trio.fail_after(READ_TIMEOUT):
                await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            await c.close()
            return f"handshake refused: {_why(exc)}"
        stream = tls
    outcome = "tls" if stream is not c.stream else "plain"
    buffer = bytearray()
    try:
        with trio.fail_after(READ_TIMEOUT):
            if stream is not c.stream:
                outcome += f", {(await _read_frame(stream, buffer) or b'EOF')[4:]!r}"
            await stream.send_all(cmds.sub("t", "ch"))
            frame = await _read_frame(stream, buffer)
    except trio.BrokenResourceError as exc:
        await c.close()
        return f"{outcome}, then refused: {_why(exc)}"
    await c.close()
    return f"{outcome}, SUB: {frame[4:]!r}" if frame is not None else f"{outcome}, SUB: EOF"


async def every_client(t: Target, certs: dict[str, str]) -> dict[str, str]:
    outcomes = {}
    for cert in ("", "client", "other"):
        for version in VERSIONS:
            key = f"{cert or 'no'} certificate, {version}"
            outcomes[key] = await tls_client(t, client_ssl(certs, cert, version))
    outcomes["no tls_v1"] = await tls_client(t, None)
    del t.transcript[:]  # (the IDENTIFY answers: compared in test_tcp_identify)
    return outcomes


POLICIES = [
    [],
    ["--tls-client-auth-policy=require"],
    ["--tls-client-auth-policy=require-verify"],
    ["--tls-client-auth-policy=no-such-policy"],
    ["--tls-root-ca-file={ca}"],
    ["--tls-client-auth-policy=require", "--tls-root-ca-file={ca}"],
    ["--tls-client-auth-policy=require-verify", "--tls-root-ca-file={ca}"],
    ["--tls-client-auth-policy=require", "--tls-required=false"],
    ["--tls-client-auth-policy=require-verify", "--tls-required=tcp-https"],
    ["--tls-required=true"],
    ["--tls-required=tcp-https", "--tls-root-ca-file={ca}"],
    ["--tls-min-version=tls1.3", "--tls-client-auth-policy=require"],
]


@pytest.mark.parametrize("flags", POLICIES, ids=lambda f: " ".join(f) or "no-policy")
async def test_client_auth_policy(
    conformance: Conformance, certs: dict[str, str], flags: list[str]
) -> None:
    async def scenario(t: Target) -> Any:
        return await every_client(t, certs)

    given = [f.format(**certs) for f in flags]
    await conformance.nsqd(
        scenario, f"--tls-cert={certs['cert']}", f"--tls-key={certs['key']}", *given
    )


async def test_tls_v1_without_a_certificate(conformance: Conformance) -> None:
    # nsqd without a certificate answers tls_v1 false; the connection stays plain.
    async def scenario(t: Target) -> Any:
        c = await t.connect()
        answer = await c.identify(feature_negotiation=True, tls_v1=True, snappy=True)
        await c.sub("t", "ch")
        return answer[2]["tls_v1"], answer[2]["snappy"]

    await conformance.nsqd(scenario)


@pytest.mark.parametrize("cert", ["client", "other"])
async def test_auth_learns_the_common_name_of_any_certificate(
    conformance: Conformance, auth_server: AuthServer, certs: dict[str, str], cert: str
) -> None:
    # With "require", a certificate nsqd cannot verify still names the client.
    auth_server.grants["s"] = {
        "ttl": 60,
        "identity": "i",
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]}],
    }

    async def scenario(t: Target) -> Any:
        start = len(auth_server.queries)
        c = await t.connect()
        await c.identify(
            feature_negotiation=True, tls_v1=True, ssl_context=client_ssl(certs, cert, "tls1.3")
        )
        await c.call(b"AUTH\n" + body(b"s"))
        await c.sub("t", "ch")
        return [json.dumps(q["query"]) for q in auth_server.queries[start:]]

    await conformance.nsqd(
        scenario,
        f"--tls-cert={certs['cert']}",
        f"--tls-key={certs['key']}",
        "--tls-client-auth-policy=require",
        f"--auth-http-address={auth_server.address}",
    )


async def test_https_with_a_client_auth_policy(
    conformance: Conformance, certs: dict[str, str]
) -> None:
    # nsqd's HTTPS listener shares the TCP listener's TLS configuration.
    async def scenario(t: Target) -> Any:
        outcomes = {}
        for cert in ("", "other"):
            for version in VERSIONS:
                ctx = client_ssl(certs, cert, version)
                host, port = t.https_address.rsplit(":", 1)
                try:
                    with trio.fail_after(READ_TIMEOUT):
                        stream = await trio.open_ssl_over_tcp_stream(
                            host, int(port), ssl_context=ctx, https_compatible=True
                        )
                        await stream.send_all(b"GET /ping HTTP/1.0\r\n\r\n")
                        data = b""
                        while chunk := await stream.receive_some(65536):
                            data += chunk
                    outcomes[f"{cert or 'no'} certificate, {version}"] = data.split(b"\r\n")[0]
                    await stream.aclose()
                except trio.BrokenResourceError as exc:
                    outcomes[f"{cert or 'no'} certificate, {version}"] = _why(exc).encode()
        return {k: v.decode() for k, v in outcomes.items()}

    await conformance.nsqd(
        scenario,
        f"--tls-cert={certs['cert']}",
        f"--tls-key={certs['key']}",
        "--tls-client-auth-policy=require",
    )
