"""The tools' error messages: the operating system's reason, the address once."""

from __future__ import annotations

import errno
import socket

from trionsq.tools.common import reason


def _raised(exc: BaseException, cause: BaseException | None) -> BaseException:
    try:
        raise exc from cause
    except BaseException as raised:
        return raised


def test_the_os_reason_deep_in_a_connect_failure() -> None:
    # What trio raises for a refused connect: a summary naming the address,
    # caused by a group of the attempts' errors.
    refused = ConnectionRefusedError(
        errno.ECONNREFUSED, "Error connecting to ('127.0.0.1', 4150): Connection refused"
    )
    group = ExceptionGroup("attempts", [refused])
    summary = _raised(OSError("all attempts to connect to 127.0.0.1:4150 failed"), group)
    wrapped = _raised(ConnectionError(f"127.0.0.1:4150: {summary}"), summary)
    assert reason(wrapped, "127.0.0.1:4150") == "connection refused"


def test_a_resolver_error_keeps_its_own_text() -> None:
    error = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert reason(error) == "name or service not known"


def test_without_an_os_error_the_text_less_the_address() -> None:
    assert reason(ValueError("127.0.0.1:4150: frame too big"), "127.0.0.1:4150") == "frame too big"
    assert reason(ValueError("bad")) == "bad"
    assert reason(TimeoutError()) == "TimeoutError"


def test_a_tls_error_is_not_read_as_a_system_error() -> None:
    import ssl

    failed = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"
    )
    assert "CERTIFICATE_VERIFY_FAILED" in reason(failed)
