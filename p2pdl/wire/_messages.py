"""Typed wire messages: declaration, msgpack envelope, strict decoding.  No I/O.

A message type is a frozen dataclass declared by subclassing :class:`Message`
with a tag::

    class Ping(Message, tag="ping"):
        nonce: int
        payload: bytes = b""

On the wire every message is the msgpack array ``[tag, request_id, body]``
where ``body`` maps field names to values (protocols/wire.md).  Decoding
checks the tag against the set of types the receiver expects and every field
against its annotation; any mismatch is a :class:`RemoteProtocolError`.

Field types: ``int``, ``float`` (finite only), ``bool``, ``str``, ``bytes``,
``None``, unions (``X | None``), ``list[X]``, ``tuple[X, ...]``,
``dict[str, X]``, ``Literal[...]``, nested :class:`Message` types, and
``Annotated[X, Range(lo, hi)]`` / ``Annotated[X, MaxLen(n)]`` for bounds.
Unknown fields are ignored, so a protocol can add optional fields without a
new version.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import msgpack

from ..errors import LocalProtocolError, RemoteProtocolError

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pragma: no cover - typing_extensions ships with our dependencies on 3.10
    from typing_extensions import dataclass_transform

__all__ = ["Message", "MessageSet", "ErrorReply", "Range", "MaxLen", "encode_message"]

#: request_id 0 marks a message that is not a request or a response.
NO_REQUEST_ID = 0
MAX_REQUEST_ID = 2**64 - 1


@dataclasses.dataclass(frozen=True)
class Range:
    """Inclusive numeric bounds for an ``Annotated`` int or float field."""

    lo: float | None = None
    hi: float | None = None


@dataclasses.dataclass(frozen=True)
class MaxLen:
    """Maximum length of an ``Annotated`` str, bytes, list, tuple or dict field."""

    n: int


class _Invalid(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


_Checker = Callable[[Any, str], Any]


@dataclass_transform(frozen_default=True)
class Message:
    """Base class of typed wire messages (see the module docstring)."""

    TAG: ClassVar[str]
    _fields: ClassVar[tuple[tuple[str, _Checker, bool, Any], ...] | None]

    def __init_subclass__(cls, *, tag: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(tag, str) or not tag:
            raise TypeError(f"{cls.__name__}: tag must be a non-empty string")
        cls.TAG = tag
        cls._fields = None  # compiled lazily: annotations may refer to later classes
        dataclasses.dataclass(frozen=True)(cls)

    def to_wire(self) -> dict[str, Any]:
        """The message body as a plain dict (nested messages stay objects)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_wire(cls, body: Any, path: str = "") -> Message:
        """Build a message from a decoded body, checking every field.

        Raises :class:`RemoteProtocolError` describing the first bad field.
        """
        try:
            return _from_wire(cls, body, path or cls.TAG)
        except _Invalid as exc:
            raise RemoteProtocolError(f"invalid {cls.TAG!r} message: {exc}") from None


class ErrorReply(Message, tag="error"):
    """Answer to a request that failed; allowed as a response in every protocol.

    ``code`` is one of the codes listed in protocols/wire.md.
    """

    code: str
    message: str


def _compile(cls: type[Message]) -> tuple[tuple[str, _Checker, bool, Any], ...]:
    compiled = cls._fields
    if compiled is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            has_default = f.default is not dataclasses.MISSING
            if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                raise TypeError(f"{cls.__name__}.{f.name}: default_factory is not supported")
            out.append((f.name, _checker_for(hints[f.name], f"{cls.__name__}.{f.name}"),
                        has_default, f.default))
        compiled = cls._fields = tuple(out)
    return compiled


def _from_wire(cls: type[Message], body: Any, path: str) -> Message:
    if type(body) is not dict:
        raise _Invalid(path, f"expected a map, got {type(body).__name__}")
    kwargs = {}
    for name, check, has_default, default in _compile(cls):
        if name in body:
            kwargs[name] = check(body[name], f"{path}.{name}")
        elif has_default:
            kwargs[name] = default
        else:
            raise _Invalid(f"{path}.{name}", "missing")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise _Invalid(path, str(exc)) from None


def _exact(tp: type) -> _Checker:
    def check(v: Any, path: str) -> Any:
        if type(v) is not tp:
            raise _Invalid(path, f"expected {tp.__name__}, got {type(v).__name__}")
        return v
    return check


def _check_float(v: Any, path: str) -> float:
    if type(v) is float or type(v) is int:
        v = float(v)
        if math.isfinite(v):
            return v
        raise _Invalid(path, "not a finite number")
    raise _Invalid(path, f"expected float, got {type(v).__name__}")


def _check_none(v: Any, path: str) -> None:
    if v is not None:
        raise _Invalid(path, f"expected nil, got {type(v).__name__}")


def _checker_for(tp: Any, where: str) -> _Checker:
    origin, args = get_origin(tp), get_args(tp)
    if tp in (int, bool, str, bytes):
        return _exact(tp)
    if tp is float:
        return _check_float
    if tp is None or tp is type(None):
        return _check_none
    if origin is Annotated:
        return _annotated(args[0], args[1:], where)
    if origin is Union or origin is types.UnionType:
        options = [_checker_for(a, where) for a in args]
        optional = type(None) in args

        def check_union(v: Any, path: str) -> Any:
            if v is None and optional:
                return None
            # Keep the reasons, not the exceptions: an exception kept past its
            # except block holds its traceback's frames, a reference cycle that
            # only the cyclic GC frees (long GC pauses on busy nodes).
            reasons = []
            for option in options:
                try:
                    return option(v, path)
                except _Invalid as exc:
                    reasons.append((exc.path, exc.reason))
            if len(options) == 2 and optional:
                raise _Invalid(*reasons[args.index(type(None)) ^ 1])  # the non-nil one's reason
            raise _Invalid(path, f"{type(v).__name__} matches none of {tp}")
        return check_union
    if origin is Literal:
        allowed = {(type(a), a) for a in args}

        def check_literal(v: Any, path: str) -> Any:
            if (type(v), v) not in allowed:
                raise _Invalid(path, f"{v!r} is not one of {list(args)}")
            return v
        return check_literal
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        item = _checker_for(args[0], where)
        convert = list if origin is list else tuple

        def check_seq(v: Any, path: str) -> Any:
            if type(v) is not list:
                raise _Invalid(path, f"expected array, got {type(v).__name__}")
            return convert(item(x, f"{path}[{i}]") for i, x in enumerate(v))
        return check_seq
    if origin is tuple:
        items = [_checker_for(a, where) for a in args]

        def check_tuple(v: Any, path: str) -> Any:
            if type(v) is not list or len(v) != len(items):
                raise _Invalid(path, f"expected array of {len(items)}")
            return tuple(c(x, f"{path}[{i}]")
                         for i, (c, x) in enumerate(zip(items, v, strict=True)))
        return check_tuple
    if origin is dict:
        key, value = _checker_for(args[0], where), _checker_for(args[1], where)

        def check_dict(v: Any, path: str) -> Any:
            if type(v) is not dict:
                raise _Invalid(path, f"expected map, got {type(v).__name__}")
            return {key(k, f"{path}<key>"): value(x, f"{path}[{k!r}]") for k, x in v.items()}
        return check_dict
    if isinstance(tp, type) and issubclass(tp, Message):
        return lambda v, path: _from_wire(tp, v, path)
    raise TypeError(f"{where}: field type {tp!r} is not supported on the wire")


def _annotated(base: Any, constraints: Iterable[Any], where: str) -> _Checker:
    check = _checker_for(base, where)
    for c in constraints:
        if isinstance(c, Range):
            check = _with_range(check, c)
        elif isinstance(c, MaxLen):
            check = _with_max_len(check, c.n)
    return check


def _with_range(inner: _Checker, r: Range) -> _Checker:
    def check(v: Any, path: str) -> Any:
        v = inner(v, path)
        if (r.lo is not None and v < r.lo) or (r.hi is not None and v > r.hi):
            raise _Invalid(path, f"{v} outside [{r.lo}, {r.hi}]")
        return v
    return check


def _with_max_len(inner: _Checker, n: int) -> _Checker:
    def check(v: Any, path: str) -> Any:
        if hasattr(v, "__len__") and len(v) > n:
            raise _Invalid(path, f"length {len(v)} exceeds {n}")
        return inner(v, path)
    return check


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, Message):
        return obj.to_wire()
    raise LocalProtocolError(f"cannot send a value of type {type(obj).__name__}")


def encode_message(message: Message, request_id: int = NO_REQUEST_ID) -> bytes:
    """Encode ``message`` as the msgpack envelope ``[tag, request_id, body]``."""
    if not isinstance(message, Message):
        raise LocalProtocolError(f"expected a Message, got {type(message).__name__}")
    if not 0 <= request_id <= MAX_REQUEST_ID:
        raise LocalProtocolError(f"request id {request_id} out of range")
    try:
        return msgpack.packb([message.TAG, request_id, message.to_wire()],
                             default=_pack_default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"cannot encode {message.TAG!r}: {exc}") from exc


def decode_envelope(payload: bytes | bytearray) -> tuple[str, int, Any]:
    """Split a MESSAGE payload into ``(tag, request_id, body)``; body is unchecked."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True,
                              timestamp=0)
    except Exception as exc:  # untrusted input: every decoder failure means malformed
        raise RemoteProtocolError(f"malformed message: {type(exc).__name__}: {exc}") from None
    if type(obj) is not list or len(obj) != 3:
        raise RemoteProtocolError("malformed message: envelope must be [tag, request_id, body]")
    tag, request_id, body = obj
    if type(tag) is not str:
        raise RemoteProtocolError("malformed message: tag must be a string")
    if type(request_id) is not int or not 0 <= request_id <= MAX_REQUEST_ID:
        raise RemoteProtocolError("malformed message: request id must be an unsigned integer")
    return tag, request_id, body


class MessageSet:
    """The message types a receiver accepts in one direction of a protocol."""

    def __init__(self, *types_: type[Message]) -> None:
        self._by_tag: dict[str, type[Message]] = {}
        for t in types_:
            if t.TAG in self._by_tag and self._by_tag[t.TAG] is not t:
                raise TypeError(f"two message types share the tag {t.TAG!r}")
            self._by_tag[t.TAG] = t
            _compile(t)  # fail at declaration time for unsupported field types

    def __contains__(self, t: type[Message]) -> bool:
        return self._by_tag.get(t.TAG) is t

    def __iter__(self):  # noqa: ANN204
        return iter(self._by_tag.values())

    def with_types(self, *types_: type[Message]) -> MessageSet:
        return MessageSet(*self._by_tag.values(), *types_)

    def decode(self, payload: bytes | bytearray) -> tuple[int, Message]:
        """Decode a MESSAGE payload into ``(request_id, message)``.

        Raises :class:`RemoteProtocolError` if it is malformed, if its tag is
        not one of this set's, or if a field does not match its type.
        """
        tag, request_id, body = decode_envelope(payload)
        cls = self._by_tag.get(tag)
        if cls is None:
            raise RemoteProtocolError(
                f"unexpected message type {tag!r} (expected one of {sorted(self._by_tag)})"
            )
        return request_id, cls.from_wire(body)
