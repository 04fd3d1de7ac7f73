"""fakensq.golang.tlsconfig: Go's client auth types on an OpenSSL server context.

Checked in memory, without nsqd: tests/conformance/test_tcp_tls.py compares
the same matrix with the real nsqd.
"""

from __future__ import annotations

import ssl

import pytest
import trio
import trio.testing

from fakensq.golang.tlsconfig import HandshakeError, server_context, server_handshake

from ..support.tls import Pki

VERSIONS = [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3]


@pytest.fixture(scope="module")
def certs(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    other = Pki(tmp_path_factory.mktemp("other-pki"))
    return {
        "cert": pki.cert,
        "key": pki.key,
        "ca": pki.ca_file,
        "client": pki.client_pem("c", common_name="mine"),
        "other": other.client_pem("o", common_name="theirs"),
    }


async def _connect(
    server_ctx: ssl.SSLContext, certs: dict[str, str], cert: str, version: ssl.TLSVersion
) -> str:
    """What the client sees: "ok <server's view of its CN>" or the alert."""
    client_ctx = ssl.create_default_context(cafile=certs["ca"])
    client_ctx.maximum_version = version
    if cert:
        client_ctx.load_cert_chain(certs[cert])
    left, right = trio.testing.memory_stream_pair()
    client = trio.SSLStream(right, client_ctx, server_hostname="127.0.0.1")
    seen: list[str] = []
    errors: list[str] = []

    async def serve() -> None:
        try:
            tls = await server_handshake(left, server_ctx)
        except HandshakeError as exc:
            errors.append(str(exc))
            await left.aclose()
            return
        peer = tls.getpeercert() or {}
        names = [v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"]
        seen.extend(names)
        await tls.send_all(b"hello")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        try:
            with trio.fail_after(10):
                await client.do_handshake()
                data = await client.receive_some(5)
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__
            why = cause.reason if isinstance(cause, ssl.SSLError) else repr(cause)
            return f"refused {why} ({', '.join(errors)})"
    assert data == b"hello"
    return f"ok {','.join(seen)}"


async def _matrix(ctx: ssl.SSLContext, certs: dict[str, str]) -> dict[tuple[str, str], str]:
    return {
        (cert or "none", v.name): await _connect(ctx, certs, cert, v)
        for cert in ("", "client", "other")
        for v in VERSIONS
    }


NO_CERT = "tls: client didn't provide a certificate"
UNKNOWN_CA = "tls: failed to verify certificate: x509: certificate signed by unknown authority"
NO_CERT_REFUSED = {
    ("none", "TLSv1_2"): f"refused SSLV3_ALERT_HANDSHAKE_FAILURE ({NO_CERT})",
    ("none", "TLSv1_3"): f"refused TLSV13_ALERT_CERTIFICATE_REQUIRED ({NO_CERT})",
}


async def test_no_policy_asks_for_no_certificate(certs: dict[str, str]) -> None:
    for root in ("", certs["ca"]):
        ctx = server_context(certs["cert"], certs["key"], root_ca_file=root)
        assert set((await _matrix(ctx, certs)).values()) == {"ok "}  # (none sent, none seen)


async def test_require_takes_any_certificate(certs: dict[str, str]) -> None:
    for root in ("", certs["ca"]):
        ctx = server_context(
            certs["cert"], certs["key"], client_auth_policy="require", root_ca_file=root
        )
        assert await _matrix(ctx, certs) == {
            **NO_CERT_REFUSED,
            ("client", "TLSv1_2"): "ok mine",
            ("client", "TLSv1_3"): "ok mine",
            ("other", "TLSv1_2"): "ok theirs",
            ("other", "TLSv1_3"): "ok theirs",
        }


async def test_require_verify_checks_the_chain(certs: dict[str, str]) -> None:
    ctx = server_context(
        certs["cert"], certs["key"], client_auth_policy="require-verify", root_ca_file=certs["ca"]
    )
    assert await _matrix(ctx, certs) == {
        **NO_CERT_REFUSED,
        ("client", "TLSv1_2"): "ok mine",
        ("client", "TLSv1_3"): "ok mine",
        ("other", "TLSv1_2"): f"refused TLSV1_ALERT_UNKNOWN_CA ({UNKNOWN_CA})",
        ("other", "TLSv1_3"): f"refused TLSV1_ALERT_UNKNOWN_CA ({UNKNOWN_CA})",
    }
    # Without a root CA file, the system's roots: a test CA is unknown.
    ctx = server_context(certs["cert"], certs["key"], client_auth_policy="require-verify")
    outcomes = await _matrix(ctx, certs)
    assert outcomes[("client", "TLSv1_3")] == f"refused TLSV1_ALERT_UNKNOWN_CA ({UNKNOWN_CA})"


async def test_a_policy_in_process_requires_tls(certs: dict[str, str]) -> None:
    import fakensq
    from fakensq.nsqd.options import TLS_REQUIRED

    node = fakensq.NSQD(
        tls_cert=certs["cert"], tls_key=certs["key"], tls_client_auth_policy="require"
    )
    assert node.options.tls_required == TLS_REQUIRED


async def test_not_a_tls_record() -> None:
    # As Go: the first record's header is looked at before anything is sent.
    for data, text in (
        (b"NOP\nNOP\n", "tls: first record does not look like a TLS handshake"),
        (b"\x16\x10\x00\x00\x01x", "tls: first record does not look like a TLS handshake"),
        (b"\x16\x03", "unexpected EOF"),
        (b"", "EOF"),
    ):
        left, right = trio.testing.memory_stream_pair()
        await right.send_all(data)
        await right.send_eof()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with pytest.raises(HandshakeError, match=text):
            await server_handshake(left, ctx)


async def test_a_handshake_that_never_comes() -> None:
    left, _right = trio.testing.memory_stream_pair()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with trio.fail_after(30):
        with pytest.raises(HandshakeError, match="read tcp a->b: i/o timeout"):
            await server_handshake(left, ctx, limit=0.05, where="a->b")
