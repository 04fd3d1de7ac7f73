"""NSQ error codes as a typed exception hierarchy.

nsqd answers a bad command with an error frame whose body is ``CODE description``
(for example ``E_BAD_TOPIC PUB topic name "a b" is not valid``).  Most errors are
fatal: nsqd closes the connection right after sending them.  Only the three
"message no longer in flight" errors (``E_FIN_FAILED``, ``E_REQ_FAILED``,
``E_TOUCH_FAILED``) leave the connection open, because they happen in normal
operation whenever a message timed out before the client answered.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "NSQError",
    "ProtocolError",
    "FrameTooLarge",
    "LineTooLong",
    "InvalidFrame",
    "CompressionError",
    "NSQErrorResponse",
    "BadProtocolError",
    "InvalidError",
    "BadTopicError",
    "BadChannelError",
    "BadBodyError",
    "BadMessageError",
    "IdentifyFailedError",
    "SubFailedError",
    "PubFailedError",
    "MPubFailedError",
    "DPubFailedError",
    "FinFailedError",
    "ReqFailedError",
    "TouchFailedError",
    "AuthDisabledError",
    "AuthFirstError",
    "AuthFailedError",
    "UnauthorizedError",
    "error_for_code",
    "parse_error_frame",
]


class NSQError(Exception):
    """Base class of every error trionsq and fakensq raise for NSQ reasons."""


class ProtocolError(NSQError):
    """Bytes on the wire that do not follow the protocol (local parse failure)."""


class FrameTooLarge(ProtocolError):
    """A frame or body announced a size above the configured limit."""


class LineTooLong(ProtocolError):
    """A command line grew past the limit without a newline (nsqd drops the client)."""


class InvalidFrame(ProtocolError):
    """A frame that cannot be decoded (bad size, unknown type, short message)."""


class CompressionError(ProtocolError):
    """A snappy or deflate stream that cannot be decoded."""


class NSQErrorResponse(NSQError):
    """An error frame as nsqd sends it: ``CODE description``.

    Subclasses fix ``code`` and whether the error is ``fatal`` (nsqd closes the
    connection after sending it).  Unknown codes parse to this base class, fatal.
    """

    code: ClassVar[str] = "E_UNKNOWN"
    fatal: ClassVar[bool] = True

    def __init__(self, description: str = "", *, code: str | None = None) -> None:
        self.description = description
        if code is not None and code != type(self).code:
            # Only used for codes without a class of their own.
            self.code = code  # type: ignore[misc]
        super().__init__(self.wire_text())

    def wire_text(self) -> str:
        """The error frame body: the code, then the description if there is one."""
        return f"{self.code} {self.description}" if self.description else self.code

    def to_bytes(self) -> bytes:
        return self.wire_text().encode("utf-8", "surrogateescape")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description!r})"


class BadProtocolError(NSQErrorResponse):
    code = "E_BAD_PROTOCOL"


class InvalidError(NSQErrorResponse):
    code = "E_INVALID"


class BadTopicError(NSQErrorResponse):
    code = "E_BAD_TOPIC"


class BadChannelError(NSQErrorResponse):
    code = "E_BAD_CHANNEL"


class BadBodyError(NSQErrorResponse):
    code = "E_BAD_BODY"


class BadMessageError(NSQErrorResponse):
    code = "E_BAD_MESSAGE"


class IdentifyFailedError(NSQErrorResponse):
    code = "E_IDENTIFY_FAILED"


class SubFailedError(NSQErrorResponse):
    code = "E_SUB_FAILED"


class PubFailedError(NSQErrorResponse):
    code = "E_PUB_FAILED"


class MPubFailedError(NSQErrorResponse):
    code = "E_MPUB_FAILED"


class DPubFailedError(NSQErrorResponse):
    code = "E_DPUB_FAILED"


class FinFailedError(NSQErrorResponse):
    code = "E_FIN_FAILED"
    fatal = False


class ReqFailedError(NSQErrorResponse):
    code = "E_REQ_FAILED"
    fatal = False


class TouchFailedError(NSQErrorResponse):
    code = "E_TOUCH_FAILED"
    fatal = False


class AuthDisabledError(NSQErrorResponse):
    code = "E_AUTH_DISABLED"


class AuthFirstError(NSQErrorResponse):
    code = "E_AUTH_FIRST"


class AuthFailedError(NSQErrorResponse):
    code = "E_AUTH_FAILED"


class UnauthorizedError(NSQErrorResponse):
    code = "E_UNAUTHORIZED"


_BY_CODE: dict[str, type[NSQErrorResponse]] = {
    cls.code: cls
    for cls in (
        BadProtocolError,
        InvalidError,
        BadTopicError,
        BadChannelError,
        BadBodyError,
        BadMessageError,
        IdentifyFailedError,
        SubFailedError,
        PubFailedError,
        MPubFailedError,
        DPubFailedError,
        FinFailedError,
        ReqFailedError,
        TouchFailedError,
        AuthDisabledError,
        AuthFirstError,
        AuthFailedError,
        UnauthorizedError,
    )
}


def error_for_code(code: str, description: str = "") -> NSQErrorResponse:
    """Build the typed error for ``code`` (unknown codes give the base class)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return NSQErrorResponse(description, code=code)
    return cls(description)


def parse_error_frame(data: bytes) -> NSQErrorResponse:
    """Turn an error frame body (``b"E_CODE description"``) into its exception."""
    text = data.decode("utf-8", "replace")
    code, _, description = text.partition(" ")
    return error_for_code(code, description)
