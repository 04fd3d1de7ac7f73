"""A plain blocking-socket NSQ client: the baseline every client benchmark divides by.

No event loop, no objects per message, no trionsq: a TCP socket, ``struct`` and
byte strings, the least a Python program can do to speak NSQ.  It imports
nothing from trionsq on purpose, so that making trionsq's protocol code faster
never moves the baseline.

Each function takes an address ``host:port`` and does one whole job; each
leaves the connection closed.  TLS (``tls=`` an :class:`ssl.SSLContext`) and
deflate are supported, so their costs can be told apart from the client's.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import zlib

MAGIC = b"  V2"
_SIZE_TYPE = struct.Struct(">lL")
_U32 = struct.Struct(">L")
_FRAME_MESSAGE = 2
_HEARTBEAT = b"_heartbeat_"
_OK = b"OK"


class _Deflate:
    """nsqd's deflate: raw DEFLATE streams, flushed per write."""

    def __init__(self, level: int) -> None:
        self.encoder = zlib.compressobj(level, zlib.DEFLATED, -15)
        self.decoder = zlib.decompressobj(-15)

    def encode(self, data: bytes) -> bytes:
        return self.encoder.compress(data) + self.encoder.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data: bytes) -> bytes:
        return self.decoder.decompress(data)


class Link:
    """One handshaken connection: ``send`` bytes, ``receive`` (decoded) bytes."""

    def __init__(
        self,
        address: str,
        identify: dict[str, object] | None = None,
        tls: ssl.SSLContext | None = None,
        deflate: int | None = None,
    ) -> None:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock: socket.socket | ssl.SSLSocket = sock
        self.codec: _Deflate | None = None
        self.pending = b""
        body = {"feature_negotiation": True, **(identify or {})}
        if tls is not None:
            body["tls_v1"] = True
        if deflate is not None:
            body["deflate"] = True
            body["deflate_level"] = deflate
        data = json.dumps(body).encode()
        sock.sendall(MAGIC + b"IDENTIFY\n" + _U32.pack(len(data)) + data)
        self.response()  # the negotiated features (JSON)
        if tls is not None:
            self.sock = tls.wrap_socket(sock, server_hostname=host)
            self.expect_ok()
        if deflate is not None:
            self.codec = _Deflate(deflate)
            self.pending = self.codec.decode(self.pending)
            self.expect_ok()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data if self.codec is None else self.codec.encode(data))

    def receive(self, size: int = 256 * 1024) -> bytes:
        data = self.sock.recv(size)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        return data if self.codec is None else self.codec.decode(data)

    def response(self) -> bytes:
        """Read one frame (during the handshake: nothing else is in flight)."""
        while True:
            if len(self.pending) >= 4:
                size = int.from_bytes(self.pending[:4], "big")
                if len(self.pending) >= 4 + size:
                    frame, self.pending = self.pending[4 : 4 + size], self.pending[4 + size :]
                    if frame[:4] != b"\0\0\0\0":
                        raise RuntimeError(f"error frame: {frame[4:]!r}")
                    return frame[4:]
            self.pending += self.receive()

    def expect_ok(self) -> None:
        data = self.response()
        if data != _OK:
            raise RuntimeError(f"expected OK, got {data[:100]!r}")

    def close(self) -> None:
        self.sock.close()


def consume(
    address: str,
    topic: str,
    channel: str,
    count: int,
    rdy: int = 2500,
    **link: object,
) -> None:
    """SUB, RDY, then FIN every message until ``count`` are done: the FINs of
    one read go out in one write.  Returns once the last FINs are written."""
    conn = Link(address, **link)  # type: ignore[arg-type]
    conn.send(b"SUB " + topic.encode() + b" " + channel.encode() + b"\n")
    conn.expect_ok()
    conn.send(b"RDY %d\n" % rdy)
    unpack = _SIZE_TYPE.unpack_from
    buf = conn.pending
    received = 0
    while received < count:
        data = conn.receive()
        buf = buf + data if buf else data
        pos = 0
        end = len(buf)
        out = []
        while end - pos >= 8:
            size, frame_type = unpack(buf, pos)
            if end - pos - 4 < size:
                break
            if frame_type == _FRAME_MESSAGE:
                out.append(b"FIN " + buf[pos + 18 : pos + 34] + b"\n")
                received += 1
            elif buf[pos + 8 : pos + 4 + size] == _HEARTBEAT:
                out.append(b"NOP\n")
            else:
                raise RuntimeError(f"unexpected frame {buf[pos : pos + 4 + size][:100]!r}")
            pos += 4 + size
        buf = buf[pos:]
        if out:
            conn.send(b"".join(out))
    conn.close()


def consume_many(addresses: list[str], topic: str, channel: str, count: int, rdy: int) -> None:
    """:func:`consume` over several nsqds at once, ``rdy`` each, with one
    ``select`` loop (the least a Python client spreading its RDY over many
    connections can do): each readable connection's messages are FINed with
    one write.  Returns once ``count`` messages in all are done."""
    import selectors

    links = [Link(address) for address in addresses]
    selector = selectors.DefaultSelector()
    buffers: dict[Link, bytes] = {}
    for link in links:
        link.send(b"SUB " + topic.encode() + b" " + channel.encode() + b"\n")
        link.expect_ok()
        link.send(b"RDY %d\n" % rdy)
        buffers[link] = link.pending
        selector.register(link.sock, selectors.EVENT_READ, link)
    unpack = _SIZE_TYPE.unpack_from
    received = 0
    while received < count:
        for key, _ in selector.select():
            link = key.data
            data = link.receive()
            buf = buffers[link]
            buf = buf + data if buf else data
            pos = 0
            end = len(buf)
            out = []
            while end - pos >= 8:
                size, frame_type = unpack(buf, pos)
                if end - pos - 4 < size:
                    break
                if frame_type == _FRAME_MESSAGE:
                    out.append(b"FIN " + buf[pos + 18 : pos + 34] + b"\n")
                    received += 1
                elif buf[pos + 8 : pos + 4 + size] == _HEARTBEAT:
                    out.append(b"NOP\n")
                else:
                    raise RuntimeError(f"unexpected frame {buf[pos : pos + 4 + size][:100]!r}")
                pos += 4 + size
            buffers[link] = buf[pos:]
            if out:
                link.send(b"".join(out))
    selector.close()
    for link in links:
        link.close()


def read_oks(conn: Link, buf: bytes) -> tuple[int, bytes]:
    """Read until at least one whole frame is there; returns the OKs read and
    what is left of the buffer (heartbeats are answered)."""
    oks = 0
    while not oks:
        data = conn.receive()
        buf = buf + data if buf else data
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            size, frame_type = _SIZE_TYPE.unpack_from(buf, pos)
            if end - pos - 4 < size:
                break
            payload = buf[pos + 8 : pos + 4 + size]
            if frame_type == 0 and payload == _OK:
                oks += 1
            elif frame_type == 0 and payload == _HEARTBEAT:
                conn.send(b"NOP\n")
            else:
                raise RuntimeError(f"unexpected frame {buf[pos : pos + 4 + size][:100]!r}")
            pos += 4 + size
        buf = buf[pos:]
    return oks, buf


def pub_command(topic: str, body: bytes) -> bytes:
    return b"PUB " + topic.encode() + b"\n" + _U32.pack(len(body)) + body


def mpub_command(topic: str, bodies: list[bytes]) -> bytes:
    parts = [_U32.pack(len(bodies))]
    for body in bodies:
        parts.append(_U32.pack(len(body)))
        parts.append(body)
    payload = b"".join(parts)
    return b"MPUB " + topic.encode() + b"\n" + _U32.pack(len(payload)) + payload


def publish_pipelined(
    address: str, topic: str, body: bytes, count: int, window: int = 256, **link: object
) -> None:
    """PUB ``count`` messages keeping ``window`` unanswered: every read's OKs
    are replaced by as many new PUBs, written at once."""
    conn = Link(address, **link)  # type: ignore[arg-type]
    # Each command is built from its body, as a client publishing different
    # messages must (not one command's bytes repeated).
    sent = min(window, count)
    conn.send(b"".join([pub_command(topic, body) for _ in range(sent)]))
    done = 0
    buf = b""
    while done < count:
        oks, buf = read_oks(conn, buf)
        done += oks
        more = min(oks, count - sent)
        if more:
            conn.send(b"".join([pub_command(topic, body) for _ in range(more)]))
            sent += more
    conn.close()


def publish_mpub(
    address: str, topic: str, body: bytes, count: int, batch: int = 100, **link: object
) -> None:
    """MPUB ``batch`` messages, wait for OK, repeat until ``count`` are published."""
    conn = Link(address, **link)  # type: ignore[arg-type]
    bodies = [body] * batch
    done = 0
    buf = b""
    while done < count:
        size = min(batch, count - done)
        # Built from its bodies each time, as a client publishing different
        # messages must.
        conn.send(mpub_command(topic, bodies if size == batch else bodies[:size]))
        _, buf = read_oks(conn, buf)
        done += size
    conn.close()


def publish_sequential(address: str, topic: str, body: bytes, count: int, **link: object) -> None:
    """PUB, wait for OK, repeat: one round trip a message."""
    publish_pipelined(address, topic, body, count, window=1, **link)
