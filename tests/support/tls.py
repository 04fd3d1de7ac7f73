"""Certificates for tests: a CA of their own (trustme), the files nsqd takes,
and the SSL contexts either end uses.

    pki = Pki(tmp_path)                      # a CA; a server certificate for 127.0.0.1
    flags = pki.nsqd_flags()                 # --tls-cert=... --tls-key=...
    client = pki.client_context()            # trusts the CA
    client_pem = pki.client_pem(common_name="worker-7")  # key and chain, one file

Nothing here is secret or lasting: every :class:`Pki` is a new CA, its files
under the folder it is given.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import trustme

__all__ = ["Pki"]


class Pki:
    """A CA, a server certificate for ``hosts`` (its files ``server.pem`` and
    ``server.key`` in ``folder``, the CA's in ``ca.pem``) and the certificates
    and contexts made from them."""

    def __init__(self, folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.ca = trustme.CA()
        self.server = self.ca.issue_cert(*hosts)
        self.ca_file = str(folder / "ca.pem")
        self.cert = str(folder / "server.pem")
        self.key = str(folder / "server.key")
        self.ca.cert_pem.write_to_path(self.ca_file)
        self.server.cert_chain_pems[0].write_to_path(self.cert)
        self.server.private_key_pem.write_to_path(self.key)

    def nsqd_flags(self, *extra: str) -> list[str]:
        """nsqd's flags serving the server certificate (then ``extra``)."""
        return [f"--tls-cert={self.cert}", f"--tls-key={self.key}", *extra]

    def client_pem(self, host: str = "client.example", common_name: str | None = None) -> str:
        """A client certificate the CA issues for ``host`` (with
        ``common_name``, what nsqd tells the auth server; None: none), its
        key and chain in one file; its path."""
        cert = self.ca.issue_cert(host, common_name=common_name)
        path = str(self.folder / f"client-{host}-{common_name or ''}.pem")
        cert.private_key_and_cert_chain_pem.write_to_path(path)
        return path

    def client_files(self, name: str = "client") -> tuple[str, str]:
        """A client certificate the CA issues, as a certificate file and a
        key file; their paths."""
        cert = self.ca.issue_cert(name)
        paths = str(self.folder / f"{name}.crt"), str(self.folder / f"{name}.key")
        cert.cert_chain_pems[0].write_to_path(paths[0])
        cert.private_key_pem.write_to_path(paths[1])
        return paths

    def client_context(
        self, cert: str = "", *, maximum: ssl.TLSVersion | None = None
    ) -> ssl.SSLContext:
        """A client context trusting the CA, presenting ``cert`` (a file of
        :meth:`client_pem`; "": none), at most TLS ``maximum``."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if cert:
            context.load_cert_chain(cert)
        if maximum is not None:
            context.maximum_version = maximum
        return context

    def server_context(self, verify: ssl.VerifyMode = ssl.CERT_NONE) -> ssl.SSLContext:
        """A server context with the server certificate; with ``verify``, it
        asks for (``CERT_OPTIONAL``) or requires a client certificate the CA
        issued."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.server.configure_cert(context)
        if verify != ssl.CERT_NONE:
            context.verify_mode = verify
            self.ca.configure_trust(context)
        return context
