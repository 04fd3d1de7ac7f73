"""fakensq.golang.tls: a server context that picks cipher suites as Go's crypto/tls."""

from __future__ import annotations

import ssl

import trio
import trustme

from fakensq.golang.tls import cipher_suite_text, prefer_go_cipher_suites


def test_suite_texts_as_nsqd_writes_them() -> None:
    assert (
        cipher_suite_text("ECDHE-RSA-AES128-GCM-SHA256") == "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
    )
    assert cipher_suite_text("TLS_AES_128_GCM_SHA256") == "Unknown 4865"
    assert cipher_suite_text("TLS_AES_256_GCM_SHA384") == "Unknown 4866"
    assert cipher_suite_text("SOMETHING-ELSE") == "SOMETHING-ELSE"


async def test_the_server_picks_go_s_first_choice() -> None:
    ca = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    assert prefer_go_cipher_suites(server_ctx)
    picked = {}
    for maximum in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        client_ctx = ssl.create_default_context()
        ca.configure_trust(client_ctx)
        client_ctx.maximum_version = maximum  # OpenSSL clients offer AES-256 first
        left, right = trio.testing.memory_stream_pair()
        server = trio.SSLStream(left, server_ctx, server_side=True)
        client = trio.SSLStream(right, client_ctx, server_hostname="127.0.0.1")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.do_handshake)
            nursery.start_soon(client.do_handshake)
        picked[maximum] = client.cipher()[0]
    assert picked == {
        ssl.TLSVersion.TLSv1_2: "ECDHE-ECDSA-AES128-GCM-SHA256",
        ssl.TLSVersion.TLSv1_3: "TLS_AES_128_GCM_SHA256",
    }
