"""Go's ``crypto/tls`` records: how a ``Write`` is cut into records.

Each ``Write`` on a ``tls.Conn`` is sent as one record or more, never merged
with another write; a client's ``SSL_read`` returns one record at a time.  Go
sizes application data records dynamically: until 128 KiB have been sent, the
n-th record carries at most n times what fits in one TCP segment (1208 bytes
less the record's overhead), then 16 KiB.  In TLS 1.0 with a CBC suite, each
write's first byte is a record of its own (the 1/n-1 split against BEAST).

Go counts the handshake's bytes toward the 128 KiB; fakensq counts only the
application data it sent (the handshake is a few KiB: the full size comes a
record or two later at most).
"""

from __future__ import annotations

from typing import Final

__all__ = ["RecordSizer"]

_MAX_PLAINTEXT: Final = 16384
_TCP_MSS_ESTIMATE: Final = 1208
_BOOST_THRESHOLD: Final = 128 * 1024
_RECORD_HEADER: Final = 5


class RecordSizer:
    """Cuts writes into records as Go's ``tls.Conn`` does on one connection.

    ``version`` and ``cipher`` as ``ssl.SSLObject.version()`` and ``.cipher()[0]``
    name them.
    """

    def __init__(self, version: str, cipher: str) -> None:
        self._tls10_cbc = False
        if version == "TLSv1.3":
            nonce, overhead = 0, 16 + 1  # AEAD tag, the inner content type
            payload = _TCP_MSS_ESTIMATE - _RECORD_HEADER - nonce - overhead
        elif "GCM" in cipher or "CHACHA20" in cipher:
            nonce, overhead = (0 if "CHACHA20" in cipher else 8), 16
            payload = _TCP_MSS_ESTIMATE - _RECORD_HEADER - nonce - overhead
        else:  # CBC with HMAC-SHA1 (Go's only default CBC suites)
            nonce = 0 if version == "TLSv1" else 16
            overhead = 20 + 1  # MAC, at least one byte of padding
            payload = ((_TCP_MSS_ESTIMATE - _RECORD_HEADER - nonce) & ~15) - 1 - 20
            self._tls10_cbc = version == "TLSv1"
        self._payload = payload
        self._overhead = _RECORD_HEADER + nonce + overhead
        self._packets = 0
        self._sent = 0

    def _max_payload(self) -> int:
        if self._sent >= _BOOST_THRESHOLD:
            return _MAX_PLAINTEXT
        n = self._payload * (self._packets + 1)
        self._packets += 1
        return min(n, _MAX_PLAINTEXT)

    def records(self, data: bytes, out: list[bytes]) -> None:
        """The records one ``Write`` of ``data`` is sent as, appended to ``out``."""
        view = memoryview(data)
        first = self._tls10_cbc and len(view) > 1
        while view:
            n = min(1 if first else len(view), self._max_payload())
            first = False
            self._record(view[:n], out)
            view = view[n:]

    def _record(self, payload: memoryview, out: list[bytes]) -> None:
        out.append(bytes(payload))
        self._sent += len(payload) + self._overhead
