"""Held messages as Arrow rows: the agent builds the arrays from their buffers
(no pandas, see trionsq/spark/_held.py); they must equal what ``pa.array`` makes."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from trionsq.message import Message
from trionsq.spark._held import Held, arrow_schema, from_ipc, to_arrow, to_ipc

messages = st.lists(
    st.builds(
        Message,
        id=st.binary(min_size=16, max_size=16),
        body=st.binary(max_size=300),
        attempts=st.integers(0, 65535),
        timestamp=st.integers(0, 2**63 - 1),
        address=st.text(min_size=1, max_size=30),
        responder=st.none(),
    ),
    max_size=40,
)


def expected(topic: str, batch: list[Message]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.body for m in batch], pa.binary()),
            pa.array([m.id.decode("ascii", "replace") for m in batch], pa.string()),
            pa.array([m.timestamp // 1000 for m in batch], pa.timestamp("us", tz="UTC")),
            pa.array([m.attempts for m in batch], pa.int32()),
            pa.array([m.address for m in batch], pa.string()),
            pa.array([topic] * len(batch), pa.string()),
        ],
        schema=arrow_schema(),
    )


@settings(max_examples=200)
@given(messages, st.text(min_size=1, max_size=64))
def test_rows_equal_what_pa_array_makes(batch: list[Message], topic: str) -> None:
    """Any ids (a lying nsqd's non-ASCII ones become valid UTF-8), bodies, times,
    addresses and topic names; and through an IPC stream as a task gets them."""
    rows = to_arrow(topic, batch)
    rows.validate(full=True)
    assert rows.equals(expected(topic, batch))
    sent = from_ipc(to_ipc(topic, [Held(m, 0.0) for m in batch]))
    assert pa.Table.from_batches(sent, arrow_schema()).equals(
        pa.Table.from_batches([expected(topic, batch)])
    )


def test_making_rows_does_not_import_pandas() -> None:
    """The agent's first reply used to import pandas (pa.array asks whether a list
    is a pandas object): a fifth of a second of its event loop, 60 MB."""
    code = (
        "import sys; from trionsq.message import Message; "
        "from trionsq.spark._held import Held, to_ipc; "
        "m = Message(b'0' * 16, b'body', 1, 10**18, '127.0.0.1:4150', None); "
        "assert to_ipc('t', [Held(m, 0.0)]); "
        "print('pandas' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
