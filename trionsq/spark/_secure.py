"""A query's secrets, and the TLS that protects the source's TCP traffic with them.

The driver's coordinator makes, per query, a random token and a TLS key with a
self-signed certificate (:meth:`QueryKeys.new`).  They reach the executors the
way the query's partitions do, inside Spark's task descriptions, and tasks hand
them to their agent over its Unix socket.  Every TCP connection of the source
(agent to coordinator, agent to agent) is TLS 1.3 with that one certificate as
the only trust anchor, on both ends: the client checks that the server holds the
query's key, the server that the client does.  It is a pre-shared key in TLS
clothing: the stdlib's ``ssl`` has no TLS-PSK before Python 3.13, and a
certificate pinned this way needs no host name, no CA and no clock agreement
beyond its ten-year validity.  A peer without the key fails the handshake: it
never gets to send a frame.

The certificate is made with the ``cryptography`` package, on the driver only
(executors load it with ``ssl``).

An internal module of :mod:`trionsq.spark` (hence the underscore): the agent
and the coordinator import its names; no public API.
"""

from __future__ import annotations

import functools
import os
import secrets
import ssl
import tempfile
from dataclasses import dataclass, field
from typing import Any

import trio

__all__ = ["QueryKeys", "TLSStream", "accept", "connect"]

TLSStream = trio.SSLStream[trio.SocketStream]

#: How the certificate names itself (nobody checks it: the certificate is pinned).
_NAME = "trionsq spark query"


@dataclass(frozen=True, slots=True)
class QueryKeys:
    """One query's token and TLS material (PEM); whoever holds them is the query's."""

    token: str
    cert: str = field(repr=False)
    key: str = field(repr=False)

    @classmethod
    def new(cls) -> QueryKeys:
        """A new token (256 random bits) and a new P-256 key with its certificate."""
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _NAME)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            # A day back: the executors' clocks may be behind the driver's.
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(
            token=secrets.token_urlsafe(32),
            cert=cert.public_bytes(serialization.Encoding.PEM).decode(),
            key=key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode(),
        )

    def fields(self) -> dict[str, str]:
        """The keys as a frame header's fields (a task's read request)."""
        return {"token": self.token, "cert": self.cert, "key": self.key}

    @classmethod
    def from_fields(cls, header: dict[str, Any]) -> QueryKeys:
        """The keys a read request carries (ValueError if it carries none)."""
        values = [header.get(name) for name in ("token", "cert", "key")]
        if not all(isinstance(value, str) and value for value in values):
            raise ValueError("the read request carries no query keys")
        token, cert, key = values
        return cls(str(token), str(cert), str(key))

    def server_context(self) -> ssl.SSLContext:
        return _contexts(self)[0]

    def client_context(self) -> ssl.SSLContext:
        return _contexts(self)[1]


@functools.lru_cache(maxsize=32)
def _contexts(keys: QueryKeys) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The query's server and client contexts (ssl.SSLError if its PEM is bad)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False  # the one trust anchor is the query's own certificate
    for context in (server, client):
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=keys.cert)
        _load_chain(context, keys)
    server.num_tickets = 0  # every connection is new: no resumption to offer
    return server, client


def _load_chain(context: ssl.SSLContext, keys: QueryKeys) -> None:
    # ssl loads a key only from a file: one in a folder of our own (mode 0700),
    # itself mode 0600, gone as soon as it is loaded.
    with tempfile.TemporaryDirectory(prefix="trionsq-spark-") as folder:
        path = os.path.join(folder, "query.pem")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(keys.key + keys.cert)
        context.load_cert_chain(path)


async def accept(stream: trio.SocketStream, context: ssl.SSLContext) -> TLSStream:
    """The server's side of the handshake (the caller bounds how long it may take)."""
    tls = trio.SSLStream(stream, context, server_side=True)
    await tls.do_handshake()
    return tls


async def connect(host: str, port: int, context: ssl.SSLContext) -> TLSStream:
    """A TLS connection to a peer that holds the query's key."""
    stream = await trio.open_tcp_stream(host, port)
    tls = trio.SSLStream(stream, context)
    try:
        await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls
