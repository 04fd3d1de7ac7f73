"""A server TLS context that asks for client certificates as Go's does.

nsqd's ``buildTLSConfig`` maps ``--tls-client-auth-policy`` to one of Go's
``tls.ClientAuthType`` values: ``require`` is ``RequireAnyClientCert`` (a
certificate must come, but it is never verified, even with
``--tls-root-ca-file``), ``require-verify`` is ``RequireAndVerifyClientCert``
(verified against ``--tls-root-ca-file``, or the system's roots without one),
anything else is ``NoClientCert`` (none asked for; the root CA file is then
read and unused).

OpenSSL can require a certificate only by verifying it.  For
``RequireAnyClientCert`` the context's verify callback is replaced, through
``ctypes``, by one that accepts whatever certificate came: the handshake then
fails only when none came, with the alert Go sends (``handshake_failure`` in
TLS 1.2, ``certificate_required`` in TLS 1.3).

A failed handshake: :func:`server_handshake` sends the alert OpenSSL made
(Go sends one too: ``unknown_ca``, ``certificate_required``...), where
``trio.SSLStream`` would drop it and the client would see a bare EOF, and
tells Go's error text (nsqd answers it in plain text: ``E_IDENTIFY_FAILED
IDENTIFY failed tls: first record does not look like a TLS handshake``).
"""

from __future__ import annotations

import ctypes
import logging
import ssl
import warnings
from typing import Final

import trio

from .tls import prefer_go_cipher_suites, with_ssl_ctx

__all__ = [
    "HandshakeError",
    "server_context",
    "server_handshake",
    "REQUIRE_ANY",
    "REQUIRE_AND_VERIFY",
]

log = logging.getLogger(__name__)

#: ``--tls-client-auth-policy`` values nsqd knows (others: no certificate asked).
REQUIRE_ANY: Final = "require"
REQUIRE_AND_VERIFY: Final = "require-verify"

_VERSIONS: Final = {
    "ssl3.0": ssl.TLSVersion.TLSv1,  # (OpenSSL has no SSL 3.0: its floor)
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}

# SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
_VERIFY_REQUIRE_PEER: Final = 0x01 | 0x02

_VerifyCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


def _accept_any(preverify_ok: int, store: int | None) -> int:
    return 1  # whatever the chain, as Go's RequireAnyClientCert


# Kept for the life of the process: OpenSSL holds its address.
_ACCEPT_ANY: Final = _VerifyCallback(_accept_any)


def _require_any_certificate(ctx: ssl.SSLContext) -> bool:
    """Ask for a client certificate and accept any; False if it could not be set."""

    def set_verify(lib: ctypes.CDLL, pointer: int) -> bool:
        function = lib.SSL_CTX_set_verify
        function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        function.restype = None
        function(pointer, _VERIFY_REQUIRE_PEER, ctypes.cast(_ACCEPT_ANY, ctypes.c_void_p))
        return True

    return with_ssl_ctx(ctx, set_verify)


def server_context(
    cert: str,
    key: str,
    *,
    min_version: str = "tls1.0",
    client_auth_policy: str = "",
    root_ca_file: str = "",
) -> ssl.SSLContext:
    """nsqd's ``buildTLSConfig``, as an OpenSSL server context."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    # nsqd is a Go server: it picks the cipher suite in Go's order, and sends
    # one TLS 1.3 session ticket (OpenSSL: two).
    prefer_go_cipher_suites(ctx)
    ctx.num_tickets = 1
    try:
        with warnings.catch_warnings():
            # nsqd's default floor is TLS 1.0, which Python flags as deprecated;
            # honouring the option must not warn in the tests of fakensq's users.
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = _VERSIONS.get(min_version.lower(), ssl.TLSVersion.TLSv1)
    except ValueError:  # an OpenSSL that refuses old versions
        pass
    if root_ca_file:
        # Read whatever the policy, as nsqd does (a bad file fails the start).
        ctx.load_verify_locations(root_ca_file)
    if client_auth_policy == REQUIRE_AND_VERIFY:
        if not root_ca_file:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go: the system roots
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif client_auth_policy == REQUIRE_ANY:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if not _require_any_certificate(ctx):
            log.warning(
                "TLS: cannot accept unverified client certificates here; "
                "--tls-client-auth-policy=require verifies them"
            )
            if not root_ca_file:
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return ctx


class HandshakeError(Exception):
    """A failed server handshake; ``str()`` is Go's error text for it,
    ``head`` the client's first bytes when they were no TLS record."""

    def __init__(self, text: str, head: bytes = b"") -> None:
        super().__init__(text)
        self.head = head


#: Go's texts for the failures OpenSSL names (the reason of its SSLError).
_GO_ERRORS: Final = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "tls: client didn't provide a certificate",
    "CERTIFICATE_VERIFY_FAILED": (
        "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    ),
    "UNEXPECTED_EOF_WHILE_READING": "EOF",
    "HTTP_REQUEST": "tls: first record does not look like a TLS handshake",
    "WRONG_VERSION_NUMBER": "tls: first record does not look like a TLS handshake",
}

_RECORD_HEADER: Final = 5


class _Replay(trio.abc.Stream):
    """A stream that first gives back bytes already read from it."""

    def __init__(self, stream: trio.abc.Stream, head: bytes) -> None:
        self._stream = stream
        self._head = head

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._head:
            head, self._head = self._head, b""
            return head
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()


async def server_handshake(
    stream: trio.abc.Stream, ctx: ssl.SSLContext, *, limit: float = 5.0, where: str = ""
) -> trio.SSLStream[trio.abc.Stream]:
    """The server side of a TLS handshake on ``stream``, within ``limit``
    seconds (nsqd's 5 s deadline).

    Raises :class:`HandshakeError` with Go's error text when it fails, after
    sending the alert OpenSSL made for the client (trio's stream drops it).
    As Go, a first record that is not a handshake (a plain command, an HTTP
    request) ends it before anything is sent.  ``where``: "local->remote",
    for the text of a timeout."""
    with trio.move_on_after(limit) as deadline:
        head = b""
        while len(head) < _RECORD_HEADER:  # (as Go, taking whatever has come)
            try:
                data = await stream.receive_some()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise HandshakeError(f"read tcp {where}: {exc}") from None
            if not data:
                raise HandshakeError("unexpected EOF" if head else "EOF")
            head += data
        if head[0] not in (0x15, 0x16) or int.from_bytes(head[1:3], "big") >= 0x1000:
            text = "tls: first record does not look like a TLS handshake"
            raise HandshakeError(text, head[:_RECORD_HEADER])
        tls: trio.SSLStream[trio.abc.Stream] = trio.SSLStream(
            _Replay(stream, head), ctx, server_side=True
        )
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            outgoing = getattr(tls, "_outgoing", None)  # the alert, not yet sent
            if isinstance(outgoing, ssl.MemoryBIO) and outgoing.pending:
                with trio.move_on_after(1):
                    try:
                        await stream.send_all(outgoing.read())
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
            cause = exc.__cause__
            reason = getattr(cause, "reason", None) or ""
            raise HandshakeError(_GO_ERRORS.get(reason, f"tls: {cause}")) from None
    if deadline.cancelled_caught:
        raise HandshakeError(f"read tcp {where}: i/o timeout")
    return tls
