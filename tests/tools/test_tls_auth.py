"""``trionsq tail`` over TLS with AUTH: the flags reach the connection."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

from fakensq import NSQD

from ..support.tls import Pki
from .helpers import publish, run_tool


def test_tail_with_tls_root_ca_and_auth_secret(nsqd_factory: Callable[..., NSQD], pki: Pki) -> None:
    server, ca_file = pki.server_context(), pki.ca_file
    secrets: list[str] = []

    def auth(query: dict[str, str]) -> dict[str, Any]:
        secrets.append(query["secret"])
        allowed = query["secret"] == "open-sesame"
        return {
            "ttl": 3600,
            "identity": "tester",
            "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]}]
            if allowed
            else [],
        }

    nsqd = nsqd_factory(ssl_context=server, auth_handler=auth)
    publish(nsqd.http_address, "secure", [b"classified"])
    base = [
        "tail",
        "--topic",
        "secure",
        "--channel",
        "c",
        "-n",
        "1",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
    ]

    ok = run_tool(*base, "--tls-root-ca-file", str(ca_file), "--auth-secret", "open-sesame")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == b"classified\n"
    assert "open-sesame" in secrets

    # No CA: the certificate cannot be verified, a clear error and exit 1.
    untrusted = run_tool(*base, "--tls", "--auth-secret", "open-sesame")
    assert untrusted.returncode == 1
    assert b"TLS" in untrusted.stderr or b"certificate" in untrusted.stderr

    # Skipping verification works; AUTH is still required.
    no_auth = run_tool(*base, "--tls-insecure-skip-verify")
    assert no_auth.returncode == 1
    assert b"auth_secret" in no_auth.stderr


def test_tail_with_tls_root_ca_and_a_client_certificate(
    nsqd_factory: Callable[..., NSQD], pki: Pki
) -> None:
    """The tool loads the certificate into the context it made from
    --tls-root-ca-file (trionsq never changes a context it is given)."""
    server = pki.server_context(ssl.CERT_REQUIRED)
    cert, key = pki.client_files("client")
    files = {"ca.pem": pki.ca_file, "cert.pem": cert, "key.pem": key}

    def auth(query: dict[str, str]) -> dict[str, Any]:
        allowed = query["secret"] == "open-sesame"
        every = [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]}]
        return {"ttl": 3600, "identity": "tester", "authorizations": every if allowed else []}

    nsqd = nsqd_factory(ssl_context=server, auth_handler=auth)
    publish(nsqd.http_address, "secure", [b"for certified eyes"])
    base = ["tail", "--topic", "secure", "--channel", "c", "-n", "1"]
    base += ["--nsqd-tcp-address", nsqd.tcp_address, "--tls-root-ca-file", str(files["ca.pem"])]
    certificate = ["--tls-cert", str(files["cert.pem"]), "--tls-key", str(files["key.pem"])]

    ok = run_tool(*base, *certificate, "--auth-secret", "open-sesame")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == b"for certified eyes\n"

    # No certificate: refused by the server's TLS.
    refused = run_tool(*base, "--auth-secret", "open-sesame")
    assert refused.returncode == 1

    # A wrong secret: told, never shown.
    wrong = run_tool(*base, *certificate, "--auth-secret", "not-the-S3CR3T")
    assert wrong.returncode == 1
    assert b"AUTH" in wrong.stderr and b"not-the-S3CR3T" not in wrong.stderr
