"""Why a connection failed, in one wording for the client, the tools and the
front ends.

A failure names the nsqd's address once and says what happened in the words a
user acts on: the operating system's reason when there is one (``connection
refused``, ``name or service not known``, as Go's tools print it), else what
the answer looked like when it was not NSQ::

    cannot connect to nsqd 127.0.0.1:4150: connection refused
    cannot connect to nsqd 127.0.0.1:4151: unexpected HTTP response, a nsqd TCP
    endpoint is required (is this nsqd's HTTP port?)

:class:`~trionsq.connection.Connection` raises its errors with these words; a
producer's, a consumer's and the tools' messages reuse them (:func:`reason`
takes the words back out of an error that has them, so nothing is said twice).
"""

from __future__ import annotations

import os
import ssl

__all__ = ["cannot_connect", "naming", "reason"]


def cannot_connect(address: str, why: BaseException | str) -> str:
    """``cannot connect to nsqd ADDRESS: REASON``; ``why`` is the words, or an
    error whose :func:`reason` they are."""
    text = why if isinstance(why, str) else reason(why, address)
    return f"cannot connect to nsqd {address}: {text}"


def naming(address: str, exc: BaseException) -> str:
    """``ADDRESS: REASON``, for a list of failures (``no nsqd reachable (...)``)."""
    return f"{address}: {reason(exc, address)}"


def reason(exc: BaseException, address: str = "") -> str:
    """Why ``exc`` happened, in the words a user acts on, for a message that
    names the address already: the operating system's reason when there is one
    in the error's chain (``connection refused``, ``name or service not
    known``), as Go's tools print it; else the error's own text, less a leading
    ``cannot connect to nsqd ADDRESS: `` or ``ADDRESS: `` (the address is said
    once).

    A failed connect's text is the connecting library's summary (trio's ``all
    attempts to connect to 127.0.0.1:4150 failed``, with the address again);
    the reason is in its cause.
    """
    found = _os_reason(exc, set())
    if found:
        return found
    text = str(exc) or type(exc).__name__
    if address:
        for prefix in (f"cannot connect to nsqd {address}: ", f"{address}: "):
            if text.startswith(prefix):
                return text[len(prefix) :]
    return text


def _os_reason(exc: BaseException, seen: set[int]) -> str:
    if id(exc) in seen:
        return ""
    seen.add(id(exc))
    # An SSL error is an OSError whose errno is OpenSSL's code, not the
    # system's (1 would read "operation not permitted"): its text says it.
    if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, ssl.SSLError):
        # os.strerror for a system error ("Connection refused"); a resolver's
        # error (negative errno) has only its own text.
        text = os.strerror(exc.errno) if exc.errno > 0 else (exc.strerror or "")
        if text:
            return text[:1].lower() + text[1:]
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _os_reason(inner, seen)
            if found:
                return found
    for linked in (exc.__cause__, exc.__context__):
        if linked is not None:
            found = _os_reason(linked, seen)
            if found:
                return found
    return ""
