"""The publish pipeline's sans-IO core (trionsq.publishing): encoding, answers, rotation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trionsq
from trionsq.protocol import commands
from trionsq.protocol.errors import (
    BadBodyError,
    BadMessageError,
    BadTopicError,
    FrameTooLarge,
    ProtocolError,
    PubFailedError,
)
from trionsq.protocol.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    HEARTBEAT,
    OK,
    encode_error,
    encode_message,
    encode_response,
)
from trionsq.publishing import (
    OK_FRAME,
    Answers,
    Counters,
    NotPublishedError,
    PublishCore,
    Rotation,
)


class Outcome:
    """A waiter that records its outcome (and that it got only one)."""

    def __init__(self, name: int) -> None:
        self.name = name
        self.outcomes: list[BaseException | None] = []

    def set_result(self, value: None) -> None:
        self.outcomes.append(None)

    def set_exception(self, error: BaseException) -> None:
        self.outcomes.append(error)


def test_the_encoders_are_the_wire_commands_and_check_their_arguments() -> None:
    core = PublishCore()
    assert core.pub("t", b"x") == commands.pub("t", b"x")
    assert core.pub("t", bytearray(b"x")) == commands.pub("t", b"x")
    assert core.mpub("t", iter([b"a", memoryview(b"b")])) == (commands.mpub("t", [b"a", b"b"]), 2)
    assert core.dpub("t", b"x", 1.5) == commands.dpub("t", 1500, b"x")
    with pytest.raises(BadTopicError, match="PUB topic name"):
        core.pub("no good", b"x")
    with pytest.raises(TypeError):
        core.pub(b"t", b"x")  # type: ignore[arg-type]
    with pytest.raises(BadMessageError, match="PUB invalid message body size 0"):
        core.pub("t", b"")
    with pytest.raises(TypeError):
        core.pub("t", "text")  # type: ignore[arg-type]
    with pytest.raises(BadBodyError, match="MPUB invalid message count 0"):
        core.mpub("t", [])
    with pytest.raises(BadMessageError, match="MPUB invalid message body size 0"):
        core.mpub("t", [b"a", b""])
    for delay in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            core.dpub("t", b"x", delay)
    with pytest.raises(TypeError):
        core.dpub("t", b"x", True)


def test_valid_topics_are_remembered_within_a_bound() -> None:
    core = PublishCore()
    for i in range(2500):
        core.pub(f"t{i}", b"x")
    assert len(core.valid_topics) <= 1000


def test_answered_counts_oks_and_refuses_anything_else() -> None:
    core = PublishCore()
    core.answered(OK, 0)
    core.answered(OK, 3)
    assert core.stats(1, 2) == trionsq.ProducerStats(
        published=4, batches=1, errors=0, in_flight=1, window=2
    )
    with pytest.raises(ProtocolError, match="unexpected response"):
        core.answered(b"CLOSE_WAIT", 0)
    assert core.errors == 1


#: one answer nsqd may send a publisher: OK, a heartbeat, or a fatal error
answers_st = st.lists(st.sampled_from(["ok", "ok", "ok", "heartbeat"]), max_size=30)


@settings(max_examples=200, deadline=None)
@given(
    answers=answers_st,
    batches=st.lists(st.integers(0, 5), min_size=30, max_size=30),
    refuse_at=st.none() | st.integers(0, 29),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_answers_go_to_their_publishes_in_order_however_the_bytes_come(
    answers: list[str], batches: list[int], refuse_at: int | None, cuts: list[int]
) -> None:
    """nsqd's answers, cut into reads anywhere: each publish gets its own
    outcome once, in order; an error frame fails its publish with nsqd's
    error and every later one with NotPublishedError; heartbeats are counted."""
    waiters = [Outcome(i) for i in range(sum(a == "ok" for a in answers) + 1)]
    counters = Counters()
    pipeline: Answers[Outcome] = Answers(counters, DEFAULT_MAX_FRAME_SIZE)
    for waiter, batch in zip(waiters, batches, strict=False):
        pipeline.expect(waiter, batch)
    stream = b""
    expected: list[type[BaseException] | None] = []
    heartbeats = 0
    refused = False
    for answer in answers:
        if answer == "heartbeat":
            stream += encode_response(HEARTBEAT)
            heartbeats += 1
        elif refuse_at is not None and len(expected) == refuse_at:
            stream += encode_error(PubFailedError("topic is exiting"))
            expected.append(PubFailedError)
            refused = True
            break
        else:
            stream += OK_FRAME
            expected.append(None)
    if refused:
        expected += [NotPublishedError] * (len(waiters) - len(expected))
    bounds = sorted({c for c in cuts if c < len(stream)} | {0, len(stream)})
    seen_beats = 0
    raised: BaseException | None = None
    for start, end in itertools.pairwise(bounds):
        try:
            seen_beats += pipeline.received(stream[start:end])
        except PubFailedError as exc:
            raised = exc
            break
    assert refused == (raised is not None)
    outcomes = [w.outcomes for w in waiters]
    for got, want in zip(outcomes, expected, strict=False):
        assert len(got) == 1
        assert (got[0] is None) if want is None else isinstance(got[0], want)
    assert all(not got for got in outcomes[len(expected) :])  # still waiting
    if not refused:
        assert seen_beats == heartbeats
    oks = [b for w, b in zip(waiters, batches, strict=False) if w.outcomes == [None]]
    assert counters.published == sum(b or 1 for b in oks)
    assert counters.batches == sum(1 for b in oks if b)
    assert counters.errors == sum(1 for got in outcomes if got and got[0] is not None)


def test_anything_but_an_answer_breaks_the_pipeline() -> None:
    pipeline: Answers[Outcome] = Answers(Counters(), 1024)
    first = Outcome(0)
    pipeline.expect(first, 0)
    with pytest.raises(ProtocolError, match="message to a producer"):
        pipeline.received(encode_message(1, 1, b"0" * 16, b"body"))
    with pytest.raises(ProtocolError, match="unexpected response"):
        Answers(Counters(), 1024).received(OK_FRAME)  # nothing was asked
    with pytest.raises(FrameTooLarge):
        Answers(Counters(), 1024).received(b"\x00\x10\x00\x00" + b"\x00" * 8)
    wrong = Outcome(1)
    other: Answers[Outcome] = Answers(Counters(), 1024)
    other.expect(wrong, 0)
    with pytest.raises(ProtocolError, match="CLOSE_WAIT"):
        other.received(encode_response(b"CLOSE_WAIT"))
    assert isinstance(wrong.outcomes[0], ProtocolError)


def test_end_fails_what_waits_once() -> None:
    counters = Counters()
    pipeline: Answers[Outcome] = Answers(counters, 1024)
    waiters = [Outcome(i) for i in range(3)]
    for waiter in waiters:
        pipeline.expect(waiter, 0)
    pipeline.received(OK_FRAME)
    pipeline.end(trionsq.ConnectionClosedError("gone"))
    assert [w.outcomes[0] is None for w in waiters] == [True, False, False]
    assert all(len(w.outcomes) == 1 for w in waiters)
    assert not pipeline and counters.errors == 2


def test_rotation_starts_with_the_last_that_worked_and_moves_on_after_failures() -> None:
    rotation = Rotation(["a:1", "b:2", "c:3"])
    assert list(rotation.attempt()) == ["a:1", "b:2", "c:3"]
    attempt = rotation.attempt()
    attempt.failed("a:1", trionsq.NSQConnectionError("a:1: refused"))
    attempt.connected("b:2")
    assert list(rotation.attempt()) == ["b:2", "c:3", "a:1"]
    rotation.lost("b:2", BadTopicError("nsqd's refusal of a command"))  # nsqd is well
    assert rotation.index == 1
    rotation.lost("b:2", None)  # closed cleanly
    assert rotation.index == 1
    rotation.lost("b:2", trionsq.NSQConnectionError("reset"))
    assert list(rotation.attempt()) == ["c:3", "a:1", "b:2"]
    with pytest.raises(ValueError, match="at least one address"):
        Rotation([])


def test_an_attempt_says_why_no_nsqd_was_reached() -> None:
    rotation = Rotation(["a:1", "b:2"])
    attempt = rotation.attempt()
    attempt.failed("a:1", trionsq.NSQConnectionError("a:1: connection refused"))
    attempt.failed("b:2", trionsq.AuthFailedError("bad secret"))
    error = attempt.error()
    assert isinstance(error, trionsq.NSQConnectionError)
    assert "a:1: connection refused" in str(error) and "b:2: E_AUTH_FAILED" in str(error)
    refused = rotation.attempt()
    refused.failed("a:1", trionsq.AuthFailedError("bad secret"))
    refused.failed("b:2", trionsq.AuthFailedError("bad secret"))
    assert isinstance(refused.error(), trionsq.AuthFailedError)  # every nsqd said so
    with pytest.raises(KeyError):
        rotation.attempt().failed("a:1", KeyError("a bug is raised as it is"))
