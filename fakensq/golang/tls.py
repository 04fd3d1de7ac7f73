"""Go's TLS choices, made on an OpenSSL server context.

nsqd v1.3.0 (the reference binaries are built with go1.27) serves TLS with Go's
``crypto/tls`` defaults: the
server picks the cipher suite in its own order of preference (AES-GCM first on
hardware with AES instructions), whatever the client's order; OpenSSL follows
the client's order.  A client sees the difference (``ssl.SSLSocket.cipher()``)
and so does ``/stats`` (``tls_cipher_suite``), so fakensq's server context takes
Go's order: :func:`prefer_go_cipher_suites`.

Python's ``ssl`` module can order TLS 1.2 suites (``set_ciphers``) but has no
call for TLS 1.3's; that one is made through ``ctypes`` on the context's
``SSL_CTX``, after checking that the pointer found is the context's (its options
read back equal); where that check fails the TLS 1.3 order stays OpenSSL's.

:func:`cipher_suite_text` is the suite as nsqd's ``/stats`` writes it: the Go
name of a TLS 1.0-1.2 suite, ``Unknown <id>`` for a TLS 1.3 one (nsqd's table
predates TLS 1.3).
"""

from __future__ import annotations

import ctypes
import ssl
from collections.abc import Callable

__all__ = [
    "prefer_go_cipher_suites",
    "cipher_suite_text",
    "ssl_ctx_pointer",
    "with_ssl_ctx",
    "GO_TLS12_SUITES",
]

#: Go's default TLS 1.0-1.2 cipher suites in its order of preference (with AES
#: hardware; since go1.22 no RSA key exchange, since go1.23 no 3DES): IANA id,
#: Go's name, OpenSSL's name.
GO_TLS12_SUITES: tuple[tuple[int, str, str], ...] = (
    (0xC02B, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256"),
    (0xC02F, "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"),
    (0xC02C, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384"),
    (0xC030, "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "ECDHE-RSA-AES256-GCM-SHA384"),
    (0xCCA9, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305"),
    (0xCCA8, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-CHACHA20-POLY1305"),
    (0xC009, "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", "ECDHE-ECDSA-AES128-SHA"),
    (0xC013, "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "ECDHE-RSA-AES128-SHA"),
    (0xC00A, "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", "ECDHE-ECDSA-AES256-SHA"),
    (0xC014, "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", "ECDHE-RSA-AES256-SHA"),
)

#: Go's TLS 1.3 suites in its order of preference (with AES hardware).
GO_TLS13_SUITES: tuple[tuple[int, str], ...] = (
    (0x1301, "TLS_AES_128_GCM_SHA256"),
    (0x1303, "TLS_CHACHA20_POLY1305_SHA256"),
    (0x1302, "TLS_AES_256_GCM_SHA384"),
)

_GO_NAME_BY_OPENSSL = {openssl: go for _, go, openssl in GO_TLS12_SUITES}
_ID_BY_OPENSSL = {
    **{openssl: suite for suite, _, openssl in GO_TLS12_SUITES},
    **{name: suite for suite, name in GO_TLS13_SUITES},
}


def ssl_ctx_pointer(ctx: ssl.SSLContext, lib: ctypes.CDLL) -> int | None:
    """The ``SSL_CTX*`` of ``ctx`` (for calls Python's ``ssl`` lacks), or None."""
    # CPython's context object is PyObject_HEAD followed by its SSL_CTX*.
    pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not pointer:
        return None
    get_options = lib.SSL_CTX_get_options
    get_options.argtypes = [ctypes.c_void_p]
    get_options.restype = ctypes.c_uint64
    # The pointer is trusted only if the context reads back its own options.
    return pointer if get_options(pointer) == int(ctx.options) else None


def with_ssl_ctx(ctx: ssl.SSLContext, call: Callable[[ctypes.CDLL, int], bool]) -> bool:
    """``call(lib, pointer)`` with OpenSSL's library (the one Python's ``ssl``
    uses) and ``ctx``'s ``SSL_CTX *``, for what the ``ssl`` module cannot set;
    False when they cannot be reached (or ``call`` says so)."""
    try:
        import _ssl

        lib = ctypes.CDLL(_ssl.__file__)
        pointer = ssl_ctx_pointer(ctx, lib)
        if pointer is None:
            return False
        return call(lib, pointer)
    except (ImportError, OSError, AttributeError, ValueError):
        return False


def _set_tls13_suites(ctx: ssl.SSLContext, suites: str) -> bool:
    def set_suites(lib: ctypes.CDLL, pointer: int) -> bool:
        function = lib.SSL_CTX_set_ciphersuites
        function.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        function.restype = ctypes.c_int
        return bool(function(pointer, suites.encode()))

    return with_ssl_ctx(ctx, set_suites)


def prefer_go_cipher_suites(ctx: ssl.SSLContext) -> bool:
    """Make the server ``ctx`` pick suites as Go's does; True if TLS 1.3's order
    could be set too (TLS 1.2's always is)."""
    ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.set_ciphers(":".join(openssl for _, _, openssl in GO_TLS12_SUITES))
    return _set_tls13_suites(ctx, ":".join(name for _, name in GO_TLS13_SUITES))


def cipher_suite_text(openssl_name: str) -> str:
    """nsqd's ``tls_cipher_suite`` for a suite OpenSSL calls ``openssl_name``."""
    go_name = _GO_NAME_BY_OPENSSL.get(openssl_name)
    if go_name is not None:
        return go_name
    suite = _ID_BY_OPENSSL.get(openssl_name)
    return f"Unknown {suite}" if suite is not None else openssl_name
