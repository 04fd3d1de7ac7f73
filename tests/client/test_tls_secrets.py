"""What a client must never do with what it is handed: change the caller's
SSLContext (another client sharing it would present a certificate that is not
its own), prompt for a key's password, or show a secret (``auth_secret``,
``tls_key_password``) in a repr, a log line or an error message."""

from __future__ import annotations

import logging
import ssl
import traceback
from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import load_pem_private_key

import trionsq
from trionsq.config import Config
from trionsq.connection import Connection

from ..support.authserver import running_auth_server
from ..support.tls import Pki
from ..support.waiting import wait_until
from .daemons import Daemons
from .minisrv import MiniNSQD

#: what no repr, log line or error text may contain
SECRET = "S3CR3T-d0-not-print"
PASSWORD = "hunter2-key-password"


@pytest.fixture
def files(pki: Pki, tmp_path: Path) -> dict[str, str]:
    """The CA, a client certificate, its key in clear and encrypted."""
    cert, key = pki.client_files("client")
    encrypted = tmp_path / "enc.pem"
    private = load_pem_private_key(Path(key).read_bytes(), None)
    encrypted.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(PASSWORD.encode()),
        )
    )
    return {"ca.pem": pki.ca_file, "cert.pem": cert, "key.pem": key, "enc.pem": str(encrypted)}


def peer_certificate(node: MiniNSQD, index: int) -> object:
    stream = node.conns[index].stream
    assert isinstance(stream, trio.SSLStream)
    return stream.getpeercert()


# --- the caller's SSLContext ---


async def test_a_callers_context_is_never_changed(
    nursery: trio.Nursery, pki: Pki, files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Producer A with a client certificate, then producer B without one,
    both given the same context: B must not present A's certificate.  A
    context cannot be copied, so a certificate goes with trionsq's own
    context (tls=True) and Config refuses it with a caller's."""
    shared = pki.client_context()
    node = MiniNSQD(nursery, tls_context=pki.server_context(ssl.CERT_OPTIONAL))
    with pytest.raises(ValueError, match=r"never changes an ssl\.SSLContext"):
        Config(tls=shared, tls_cert=files["cert.pem"], tls_key=files["key.pem"])
    # A: trionsq's own context (trusting the test CA through the system's
    # trust store), the certificate loaded into it.
    monkeypatch.setenv("SSL_CERT_FILE", files["ca.pem"])
    async with trionsq.Producer(
        ["nsqd:4150"],
        connector=node.connector,
        tls=True,
        tls_cert=files["cert.pem"],
        tls_key=files["key.pem"],
    ) as a:
        await a.publish("topic", b"from A")
        subject_a = peer_certificate(node, 0)
    assert isinstance(subject_a, dict) and subject_a.get("subject")
    # B: the shared context, untouched.
    async with trionsq.Producer(["nsqd:4150"], connector=node.connector, tls=shared) as b:
        await b.publish("topic", b"from B")
        assert not peer_certificate(node, 1)  # B presented nothing
    assert node.published == [("topic", b"from A"), ("topic", b"from B")]


async def test_the_callers_context_is_used_as_it_is(nursery: trio.Nursery, pki: Pki) -> None:
    context = pki.client_context()
    node = MiniNSQD(nursery, tls_context=pki.server_context(ssl.CERT_OPTIONAL))
    conn = await Connection.open("nsqd:4150", Config(tls=context, connector=node.connector))
    try:
        stream = conn._stream
        assert isinstance(stream, trio.SSLStream)
        assert stream.context is context
    finally:
        await conn.aclose()


# --- a key's password ---


def test_an_encrypted_key_without_its_password_is_a_clear_error(files: dict[str, str]) -> None:
    """Never OpenSSL's prompt on the terminal (a hang in a service)."""
    with pytest.raises(ValueError, match="tls_key is encrypted: set tls_key_password"):
        Config(tls=True, tls_cert=files["cert.pem"], tls_key=files["enc.pem"])


def test_a_wrong_key_password_is_named_and_not_shown(files: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="tls_key_password") as caught:
        Config(
            tls=True,
            tls_cert=files["cert.pem"],
            tls_key=files["enc.pem"],
            tls_key_password="not-" + PASSWORD,
        )
    assert PASSWORD not in "".join(traceback.format_exception(caught.value))


def test_key_password_options_are_checked() -> None:
    with pytest.raises(ValueError, match="tls_key_password needs tls_key"):
        Config(tls=True, tls_key_password="x")
    with pytest.raises(TypeError, match="tls_key_password must be a str or bytes"):
        Config(tls=True, tls_key_password=5)  # type: ignore[arg-type]


async def test_an_encrypted_key_with_its_password(
    nursery: trio.Nursery, pki: Pki, files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", files["ca.pem"])
    node = MiniNSQD(nursery, tls_context=pki.server_context(ssl.CERT_REQUIRED))
    async with trionsq.Producer(
        ["nsqd:4150"],
        connector=node.connector,
        tls=True,
        tls_cert=files["cert.pem"],
        tls_key=files["enc.pem"],
        tls_key_password=PASSWORD.encode(),
    ) as producer:
        await producer.publish("topic", b"signed")
        assert peer_certificate(node, 0)


# --- secrets in reprs, logs and errors ---


def secret_free(*texts: str) -> bool:
    return not any(SECRET in text or PASSWORD in text for text in texts)


def record_texts(records: list[logging.LogRecord]) -> list[str]:
    """Every log record of the client's as a handler would write it,
    traceback included (the in-process servers' own are theirs: fakensq's
    nsqd asks its auth server with the secret in the URL, as nsqd does)."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return [formatter.format(r) for r in records if r.name.split(".")[0] == "trionsq"]


def error_texts(error: BaseException) -> list[str]:
    return [str(error), repr(error), "".join(traceback.format_exception(error))]


def test_config_repr_masks_secrets(files: dict[str, str]) -> None:
    config = Config(
        tls=True,
        tls_cert=files["cert.pem"],
        tls_key=files["enc.pem"],
        tls_key_password=PASSWORD,
        auth_secret=SECRET,
    )
    for shown in (repr(config), str(config), repr(config.replace(max_in_flight=3))):
        assert secret_free(shown)
        assert "auth_secret='***'" in shown and "tls_key_password='***'" in shown
    assert "auth_secret=None" in repr(Config())
    # Secrets as bytes too, and never in a validation error.
    assert secret_free(repr(Config(auth_secret=SECRET.encode())))
    with pytest.raises(ValueError) as caught:
        Config(auth_secret=SECRET, max_in_flight=-1)
    assert secret_free(*error_texts(caught.value))


async def test_a_refused_secret_is_in_no_log_line_and_no_error(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    node = MiniNSQD(nursery, auth_secret=b"the right one")
    errors: list[BaseException] = []
    with pytest.raises(trionsq.AuthFailedError) as caught:
        async with trionsq.Producer(
            ["nsqd:4150"], connector=node.connector, auth_secret=SECRET
        ) as producer:
            await producer.publish("topic", b"refused")
    errors.append(caught.value)
    async with trionsq.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=["nsqd:4150"],
        connector=node.connector,
        auth_secret=SECRET,
        handler=lambda m: None,
        reconnect_backoff=trionsq.BackoffPolicy(base=0.01, max=0.01),
    ):
        # Sent (refused, retried) a few times.
        await wait_until(lambda: sum(c.record.auth == SECRET.encode() for c in node.conns) >= 3)
    texts = record_texts(caplog.records) + [t for e in errors for t in error_texts(e)]
    assert any("AUTH failed" in text for text in texts)  # the failure is told...
    assert secret_free(*texts)  # ...without the secret


async def test_secrets_with_the_real_auth_flow(
    daemons: Daemons, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd asks its auth server, which refuses the secret, then is down:
    whatever comes back, the logs and errors tell it without the secret."""
    caplog.set_level(logging.DEBUG)
    errors: list[BaseException] = []

    async def try_both(address: str) -> None:
        with pytest.raises(trionsq.NSQError) as caught:
            async with trionsq.Producer([address], auth_secret=SECRET) as producer:
                await producer.publish("topic", b"refused")
        errors.append(caught.value)
        refused = len([r for r in caplog.records if "cannot connect" in r.getMessage()])
        async with trionsq.Consumer(
            "topic", "chan", nsqd_tcp_addresses=[address], auth_secret=SECRET, handler=print
        ):
            await wait_until(
                lambda: (
                    len([r for r in caplog.records if "cannot connect" in r.getMessage()]) > refused
                )
            )

    with running_auth_server({"other": ["subscribe", "publish"]}) as auth:
        nsqd = await daemons.nsqd(f"--auth-http-address={auth.address}")
        await try_both(nsqd.tcp_address)
    assert set(auth.seen) == {SECRET}  # nsqd asked with it
    await try_both(nsqd.tcp_address)  # the auth server is gone now
    texts = record_texts(caplog.records) + [t for e in errors for t in error_texts(e)]
    assert sum("AUTH failed" in text for text in texts) >= 4
    assert secret_free(*texts)
