"""Typed messages: strict decoding of everything a peer may send."""

from __future__ import annotations

from typing import Annotated, Literal

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pdl.errors import LocalProtocolError, RemoteProtocolError
from p2pdl.wire import ErrorReply, MaxLen, Message, MessageSet, Range, encode_message


class Point(Message, tag="test.point"):
    x: float
    y: float


class Hello(Message, tag="test.hello"):
    version: Annotated[int, Range(0, 10)]
    name: Annotated[str, MaxLen(16)]
    tags: tuple[str, ...] = ()
    points: list[Point] | None = None
    mode: Literal["fast", "safe"] = "safe"
    blob: bytes = b""
    extra: dict[str, int] | None = None


SET = MessageSet(Hello, Point)


def raw(tag, rid, body) -> bytes:
    return msgpack.packb([tag, rid, body], use_bin_type=True)


def test_round_trip_keeps_types_and_request_id():
    msg = Hello(3, "peer", ("a", "b"), [Point(1.0, 2.5)], "fast", b"\x00\xff", {"k": 1})
    rid, back = SET.decode(encode_message(msg, 77))
    assert rid == 77 and back == msg and isinstance(back.tags, tuple)


def test_defaults_fill_missing_optional_fields_and_unknown_fields_are_ignored():
    rid, msg = SET.decode(raw("test.hello", 0, {"version": 1, "name": "n", "future": [1, 2]}))
    assert msg == Hello(1, "n")


@pytest.mark.parametrize("body, reason", [
    ({"name": "n"}, "version: missing"),
    ({"version": True, "name": "n"}, "expected int, got bool"),
    ({"version": 11, "name": "n"}, "outside"),
    ({"version": 1, "name": "x" * 17}, "exceeds 16"),
    ({"version": 1, "name": b"bytes"}, "expected str"),
    ({"version": 1, "name": "n", "mode": "other"}, "not one of"),
    ({"version": 1, "name": "n", "points": [{"x": 1.0}]}, "points\\[0\\].y: missing"),
    ({"version": 1, "name": "n", "points": [{"x": float("nan"), "y": 0.0}]}, "finite"),
    ({"version": 1, "name": "n", "tags": "abc"}, "expected array"),
    ({"version": 1, "name": "n", "extra": {"k": "v"}}, "matches none|expected int"),
    ([1, 2], "expected a map"),
])
def test_wrong_fields_are_remote_protocol_errors(body, reason):
    with pytest.raises(RemoteProtocolError, match=reason):
        SET.decode(raw("test.hello", 1, body))


@pytest.mark.parametrize("payload, reason", [
    (b"\xc1", "malformed"),
    (msgpack.packb(["test.hello", 1]), "envelope"),
    (msgpack.packb([1, 1, {}]), "tag must be a string"),
    (msgpack.packb(["test.hello", -1, {}]), "request id"),
    (msgpack.packb(["test.nope", 1, {}]), "unexpected message type"),
    (msgpack.packb(["test.hello", 1, {}]) + b"\x00", "malformed"),
    (msgpack.packb({1: 2}), "malformed|envelope"),
])
def test_malformed_envelopes(payload, reason):
    with pytest.raises(RemoteProtocolError, match=reason):
        SET.decode(payload)


def test_error_reply_is_a_normal_message():
    errors = MessageSet(ErrorReply)
    assert errors.decode(encode_message(ErrorReply("timeout", "slow"), 5)) == \
        (5, ErrorReply("timeout", "slow"))


def test_local_misuse_is_local_protocol_error():
    with pytest.raises(LocalProtocolError):
        encode_message("not a message")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        encode_message(Hello(1, "n", extra={"k": object()}))  # type: ignore[dict-item]
    with pytest.raises(LocalProtocolError):
        encode_message(Hello(1, "n"), request_id=-1)


def test_unsupported_field_type_fails_at_declaration():
    class Bad(Message, tag="test.bad"):
        value: object

    with pytest.raises(TypeError, match="not supported"):
        MessageSet(Bad)


def test_duplicate_tags_rejected():
    class Other(Message, tag="test.point"):
        z: int

    with pytest.raises(TypeError, match="share the tag"):
        MessageSet(Point, Other)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["test.hello", "test.point", "x"]), st.integers(0, 2**64 - 1),
       st.dictionaries(st.sampled_from(["version", "name", "tags", "points", "mode", "blob",
                                        "extra", "x", "y", "other"]), json_like, max_size=8))
def test_fuzz_typed_bodies(tag, rid, body):
    try:
        _, msg = SET.decode(raw(tag, rid, body))
    except RemoteProtocolError:
        return
    assert SET.decode(encode_message(msg, rid))[1] == msg  # accepted means re-encodable
