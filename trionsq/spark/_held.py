"""Messages an agent holds un-FINed, and how they become Arrow rows."""

from __future__ import annotations

import array
import itertools
import operator
from collections.abc import Iterable, Sequence
from typing import Any

from ..message import Message
from ..tracecontext import Unwrapped
from ._options import SourceOptions

__all__ = ["Held", "arrow_schema", "chunks", "from_ipc", "ipc_limit", "to_arrow", "to_ipc"]


def _pyarrow() -> Any:
    import pyarrow  # type: ignore[import-untyped]

    return pyarrow


class Held:
    """A message held un-FINed, with when nsqd's timeout for it last started."""

    __slots__ = ("context", "message", "touched")

    def __init__(self, message: Message, now: float) -> None:
        self.message = message
        #: delivery or last TOUCH, on the holder's Trio clock
        self.touched = now
        #: what its trace context envelope held (option trace_context)
        self.context: Unwrapped | None = None


def arrow_schema() -> Any:
    """The ``nsq`` source's rows as Arrow, exactly as Spark checks a batch against them."""
    pa = _pyarrow()
    return pa.schema(
        [
            pa.field("body", pa.binary()),
            pa.field("id", pa.string()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("attempts", pa.int32()),
            pa.field("nsqd_address", pa.string()),
            pa.field("topic", pa.string()),
        ]
    )


#: array.array's codes for Arrow's 32-bit offsets and int32, and int64 (native order,
#: as Arrow's buffers are)
_INT32 = next(code for code in "ilh" if array.array(code).itemsize == 4)
_INT64 = "q"


def _variable(pa: Any, kind: Any, values: Sequence[bytes]) -> Any:
    """A binary or string array made from its buffers: offsets and the joined data.

    ``pa.array`` on a Python list first asks whether it is a pandas object, which
    imports pandas (a fifth of a second, 60 MB) in an agent that never needs it,
    on its event loop, at its first reply; and it is slower for bytes."""
    offsets = array.array(_INT32, itertools.accumulate(map(len, values), initial=0))
    data = b"".join(values)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, len(values), buffers)


def _fixed(pa: Any, kind: Any, code: str, values: Iterable[int]) -> Any:
    numbers = array.array(code, values)
    return pa.Array.from_buffers(kind, len(numbers), [None, pa.py_buffer(numbers)])


_BODY = operator.attrgetter("body")
_ID = operator.attrgetter("id")
_TIMESTAMP = operator.attrgetter("timestamp")
_ATTEMPTS = operator.attrgetter("attempts")
_ADDRESS = operator.attrgetter("address")


def _repeated(pa: Any, kind: Any, value: bytes, count: int) -> Any:
    """A string array of ``count`` times ``value`` (offsets by arithmetic)."""
    step = len(value)
    offsets = array.array(_INT32, range(0, step * count + 1, step) if step else [0] * (count + 1))
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(value * count)]
    return pa.Array.from_buffers(kind, count, buffers)


def to_arrow(topic: str, messages: Sequence[Message]) -> Any:
    """One Arrow record batch of ``messages`` (bodies up to 2 GiB in all: see
    :func:`chunks`).

    Each column is one pass of C-level ``map`` over the messages (a list
    comprehension per column cost twice as much: this runs on the agent's event
    loop, for every row of every batch)."""
    pa = _pyarrow()
    count = len(messages)
    ids = list(map(_ID, messages))
    if not b"".join(ids).isascii():  # nsqd's ids are hex; a string column must be UTF-8
        ids = [i.decode("ascii", "replace").encode() for i in ids]
    addresses = list(map(_ADDRESS, messages))
    encoded = {address: address.encode() for address in set(addresses)}
    # Spark's timestamps are microseconds; nsqd's are nanoseconds.
    times = map(operator.floordiv, map(_TIMESTAMP, messages), itertools.repeat(1000))
    return pa.RecordBatch.from_arrays(
        [
            _variable(pa, pa.binary(), list(map(_BODY, messages))),
            _variable(pa, pa.string(), ids),
            _fixed(pa, pa.timestamp("us", tz="UTC"), _INT64, times),
            _fixed(pa, pa.int32(), _INT32, map(_ATTEMPTS, messages)),
            _variable(pa, pa.string(), list(map(encoded.__getitem__, addresses))),
            _repeated(pa, pa.string(), topic.encode(), count),
        ],
        schema=arrow_schema(),
    )


#: Bodies per Arrow record batch at most: binary arrays index their data with
#: 32-bit offsets (2 GiB), and smaller batches spread the JVM's work.
MAX_BATCH_BYTES = 64 << 20


def chunks(messages: Sequence[Message]) -> Iterable[Sequence[Message]]:
    """``messages`` cut where their bodies pass :data:`MAX_BATCH_BYTES`."""
    if sum(map(len, map(_BODY, messages))) <= MAX_BATCH_BYTES:
        yield messages  # the usual case, without a pass in Python
        return
    start = size = 0
    for index, message in enumerate(messages):
        size += len(message.body)
        if size > MAX_BATCH_BYTES and index > start:
            yield messages[start:index]
            start, size = index, len(message.body)
    if start < len(messages) or not messages:
        yield messages[start:]


_MESSAGE = operator.attrgetter("message")


def to_ipc(topic: str, messages: Iterable[Held]) -> bytes:
    """``messages`` as an Arrow IPC stream (what an agent sends a task)."""
    pa = _pyarrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, arrow_schema()) as writer:
        for chunk in chunks(list(map(_MESSAGE, messages))):
            if chunk:
                writer.write_batch(to_arrow(topic, chunk))
    return bytes(sink.getvalue())


def from_ipc(data: bytes | memoryview) -> list[Any]:
    """The record batches of an Arrow IPC stream."""
    pa = _pyarrow()
    with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
        return list(reader)


def ipc_limit(options: SourceOptions) -> int:
    """The most bytes one set's Arrow rows may take on the wire: four times what a
    slot may hold in bodies (its RDY follows the bodies' average size, so a set can
    overshoot), and 64 MiB for the other columns."""
    return 4 * options.max_bytes_in_flight + (64 << 20)
