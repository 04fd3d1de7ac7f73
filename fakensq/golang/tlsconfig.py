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
``trio.SSLStream`` would drop it and the client would see a bare EOF.
"""

from __future__ import annotations

import ctypes
import logging
import ssl
import warnings
from typing import Final

import trio

from .tls import prefer_go_cipher_suites, ssl_ctx_pointer

__all__ = ["server_context", "server_handshake", "REQUIRE_ANY", "REQUIRE_AND_VERIFY"]

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
    try:
        import _ssl

        lib = ctypes.CDLL(_ssl.__file__)
        pointer = ssl_ctx_pointer(ctx, lib)
        if pointer is None:
            return False
        set_verify = lib.SSL_CTX_set_verify
        set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        set_verify.restype = None
        set_verify(pointer, _VERIFY_REQUIRE_PEER, ctypes.cast(_ACCEPT_ANY, ctypes.c_void_p))
        return True
    except (ImportError, OSError, AttributeError, ValueError):
        return False


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


async def server_handshake(
    stream: trio.abc.Stream, ctx: ssl.SSLContext
) -> trio.SSLStream[trio.abc.Stream]:
    """The server side of a TLS handshake on ``stream``.

    Raises ``trio.BrokenResourceError`` when it fails, after sending the alert
    OpenSSL made for the client (trio's stream drops it)."""
    tls = trio.SSLStream(stream, ctx, server_side=True)
    try:
        await tls.do_handshake()
    except trio.BrokenResourceError:
        outgoing = getattr(tls, "_outgoing", None)  # the alert, not yet sent
        if isinstance(outgoing, ssl.MemoryBIO) and outgoing.pending:
            with trio.move_on_after(1):
                try:
                    await stream.send_all(outgoing.read())
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
        raise
    return tls
