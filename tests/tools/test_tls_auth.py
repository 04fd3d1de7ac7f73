"""``trionsq tail`` over TLS with AUTH: the flags reach the connection."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trustme

from fakensq import NSQD

from .helpers import publish, run_tool


def test_tail_with_tls_root_ca_and_auth_secret(
    nsqd_factory: Callable[..., NSQD], tmp_path: Path
) -> None:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
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
