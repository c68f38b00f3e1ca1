"""Tensor codecs of the all-reduce: how a float32 vector travels.  No I/O.

A codec turns a piece of the averaged vector (any float tensor, read as
float32) into bytes and back.  Each ``encode`` call is self-contained: the
all-reduce encodes chunk by chunk and a chunk's bytes are the data of one
TENSOR frame (``p2pdl.wire``), whose header names the codec (``codec``) and
its parameters (``meta``, see :meth:`Codec.meta` and :func:`codec_from_header`).
The header's ``dtype`` stays ``float32``: the codec is how it travels.

Codecs and their error bounds (``x`` is the float32 value sent, ``y`` the
value decoded; every bound is tested):

* ``none`` -- float32 as is, little-endian; 4 bytes per value.  Exact:
  ``y == x``.
* ``fp16`` -- IEEE half precision, round to nearest; 2 bytes per value.
  Values are first clamped to fp16's finite range ``[-65504, 65504]``, so no
  infinity is ever sent.  ``|y - x| <= max(2**-11 * |x|, 2**-25)`` for
  ``|x| <= 65504`` (relative ``2**-11`` in the normal range, absolute
  ``2**-25`` among the subnormals below ``2**-14``), and
  ``|y - x| = |x| - 65504`` above it.
* ``uint8`` -- 8-bit blockwise quantization; about 1 byte per value.  The
  flattened tensor is cut into blocks of ``block_size`` values (default
  :data:`DEFAULT_BLOCK_SIZE` = 4096: 8 bytes of header per 4 KiB of codes,
  0.2 % overhead, while one outlier spoils the resolution of only 4096
  values; the last block may be shorter).  Each block stores its minimum
  ``m`` and ``scale = (max - m) / 255`` as float32 and one code per value,
  ``code = round((x - m) / scale)``; decoding gives ``m + code * scale``.
  A constant block has scale 0 and decodes exactly.  Per block,
  ``|y - x| <= scale / 2 = (max - min) / 510``, up to float32 rounding:
  exactly, ``|y - x| <= (max - min) / 510 * (1 + 2**-12)
  + 2**-23 * max(|min|, |max|) + 2**-140``.  Values beyond ``+-2**125``
  (:data:`UINT8_LIMIT`) are first clamped to it, so that no intermediate
  overflows.

  Payload layout, for ``n`` values in ``k = ceil(n / block_size)`` blocks:
  ``k`` float32 minima | ``k`` float32 scales | ``n`` uint8 codes.
* ``uint4`` -- the same with 16 levels, two codes per byte; about half a
  byte per value.  Blocks default to :data:`DEFAULT_UINT4_BLOCK_SIZE` = 256
  values (8 bytes of header per 128 of codes, 6 % overhead: with 16 levels
  an outlier costs more resolution, so blocks are smaller).  ``scale = (max
  - m) / 15``; per block ``|y - x| <= (max - min) / 30 * (1 + 2**-12)
  + 2**-23 * max(|min|, |max|) + 2**-140`` (about 11 % relative error on
  Gaussian values).

  Payload layout: ``k`` float32 minima | ``k`` float32 scales |
  ``ceil(n / 2)`` bytes of codes, value ``2i`` in the low four bits of byte
  ``i`` and value ``2i + 1`` in the high four; with ``n`` odd the last high
  four bits are 0.
* ``topk`` -- blockwise top-k sparsification: per block of ``block_size``
  values (default :data:`DEFAULT_TOPK_BLOCK_SIZE` = 256, at most
  :data:`MAX_TOPK_BLOCK_SIZE`), the ``k`` of largest magnitude (default
  :data:`DEFAULT_TOPK_K` = 8; all of a shorter last block's, up to ``k``),
  as fp16 after clamping to ``+-65504``; every other value decodes as 0.
  A kept value's error is fp16's; a dropped one's is its own magnitude.
  4 bytes per value kept: 0.125 per value at the defaults.  Results travel
  with :meth:`Codec.for_results`: ``topk`` with ``k`` times the group's
  members per block, which carries a combination of the members' decoded
  values whole.

  Payload layout, ``e`` entries in all: ``e`` uint16 positions (within
  their block, strictly ascending in each block, blocks in order) |
  ``e`` fp16 values.
* ``qtopk`` -- ``topk``'s choice of values in fewer bytes: positions take
  one byte in blocks of at most 256 values, and each kept value ``bits``
  bits (default :data:`DEFAULT_QTOPK_BITS` = 2; 2, 4, 8 or 16) on a grid
  per block from its least kept value to its largest: an fp16 minimum
  ``low`` (rounded down) and ``step`` (the range over ``2**bits - 1``,
  rounded up), code ``round((x - low) / step)``, decoded ``low + code *
  step``.  A kept value's error is at most half a step (times ``1 +
  2**-12``, plus float32 rounding, ``2**-23 * max(|low|, |low + levels *
  step|) + 2**-140``); a dropped one's its own magnitude.  At 16 bits the
  kept values travel as fp16 instead, with no grid.  The defaults (256,
  8, 2 bits) cost 14 bytes per block: 0.055 per value.  Results travel as
  ``qtopk`` with ``k`` times the group's members per block at 16 bits, 3
  bytes per value kept: a result is an average, off its contributors'
  grids, and verification reads the result codec's rounding as slack, so
  it stays fp16's.

  Payload layout, ``e`` entries in ``m`` blocks: below 16 bits, ``m``
  fp16 minima | ``m`` fp16 steps | ``e`` positions | the codes, ``8 /
  bits`` to a byte, the first in the low bits, the bits after the last 0;
  at 16 bits, ``e`` fp16 values | ``e`` positions.

Encoding a NaN or an infinity (also a float64 value beyond float32's range)
raises :class:`LocalProtocolError`.  Decoding is strict, since the bytes come
from a peer: a payload of the wrong length, a NaN or infinity among float32 or
fp16 values, a non-finite or out-of-range block minimum, a negative or
non-finite scale, a ``uint4`` payload whose unused last four bits are not
0, ``topk`` or ``qtopk`` positions out of their block or not strictly
ascending in it, a ``qtopk`` grid that is not finite or has a negative
step, or a ``qtopk`` code bit set after its last entry all raise
:class:`RemoteProtocolError`.  A decoded tensor is
therefore always finite.

:func:`choose_codec` picks a codec per tensor by its size
(:class:`CodecPolicy`): small tensors (biases, norms) go exact, where
compression saves little; large ones compressed.

Speed, measured for 10M float32 values on the 2-core CPU the project develops
on (torch 2.13, medians): ``none`` encodes in 1.5 ms (zero-copy, a finiteness
check) and decodes in 1.4 ms (sharing the buffer); ``fp16`` 3.5 ms + 3.5 ms;
``uint8`` 15-19 ms + 6 ms; ``topk`` about 105 ms + 20 ms (``torch.topk``
per block is most of it; a sort or ``kthvalue`` is slower); ``qtopk``
about 15 % slower than ``topk`` to encode and twice as slow to decode
(89 ms + 12 ms against 77 ms + 6 ms in one run).  Decodes write
into a reused ``out=``; a fresh 40 MB result costs about 15 ms more in page faults.  Everything is
vectorized; ``uint8`` works through groups of blocks that fit in cache rather
than making 40 MB temporaries (3x faster).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ConfigError, LocalProtocolError, RemoteProtocolError
from ._norms import norm_upper

if TYPE_CHECKING:
    import torch

__all__ = ["Codec", "NoneCodec", "Float16Codec", "Uint8Codec", "Uint4Codec", "TopKCodec",
           "QTopKCodec", "CODECS", "CodecPolicy", "choose_codec", "get_codec",
           "codec_from_header", "DEFAULT_BLOCK_SIZE", "DEFAULT_UINT4_BLOCK_SIZE",
           "DEFAULT_TOPK_BLOCK_SIZE", "DEFAULT_TOPK_K", "MAX_TOPK_BLOCK_SIZE",
           "DEFAULT_QTOPK_BITS", "QTOPK_BITS", "MAX_BLOCK_SIZE", "FP16_MAX", "UINT8_LIMIT"]

#: Values per block of the ``uint8`` codec unless said otherwise.
DEFAULT_BLOCK_SIZE = 4096
#: Values per block of the ``uint4`` codec unless said otherwise.
DEFAULT_UINT4_BLOCK_SIZE = 256
#: Values per block of the ``topk`` codec unless said otherwise.
DEFAULT_TOPK_BLOCK_SIZE = 256
#: Values ``topk`` keeps per block unless said otherwise (1/32 of them).
DEFAULT_TOPK_K = 8
#: Bits per kept value of the ``qtopk`` codec unless said otherwise.
DEFAULT_QTOPK_BITS = 2
#: The value widths ``qtopk`` offers.
QTOPK_BITS = (2, 4, 8, 16)
#: The largest ``topk`` block: positions travel as 16-bit numbers.
MAX_TOPK_BLOCK_SIZE = 2**16
#: The largest block size a peer may announce.
MAX_BLOCK_SIZE = 2**24
#: The largest finite fp16 value.
FP16_MAX = 65504.0
#: ``uint8`` clamps values to ``[-UINT8_LIMIT, UINT8_LIMIT]``; with it every
#: block's range, scale and decoded value stay finite in float32.
UINT8_LIMIT = 2.0**125
#: The largest scale a valid ``uint8`` block can have (range ``2**126`` / 255 < 2**119).
_UINT8_MAX_SCALE = 2.0**119
#: The same for ``uint4`` (``2**126`` / 15 < 2**123; ``2**125 + 15 * 2**123`` is finite).
_UINT4_MAX_SCALE = 2.0**123
#: Values per group of blocks worked on at once (``uint8``, ``topk``): 4 MB of float32.
_GROUP_VALUES = 2**20


def _as_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened, contiguous, float32 and on the CPU; no copy when it already is."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise LocalProtocolError(f"expected a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise LocalProtocolError(f"cannot encode a {t.dtype} tensor")
    return t.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1)


def _check_finite_local(flat: torch.Tensor) -> None:
    # One reduction instead of isfinite's 10 MB mask: about 30x faster.
    if not _all_finite(flat):
        raise LocalProtocolError("cannot encode a tensor with NaN or infinite values "
                                 "(or float64 values beyond float32's range)")


def _all_finite(values: torch.Tensor) -> bool:
    """Whether every value is finite, in one reduction (NaN propagates through
    min and max, and an infinity is one of them)."""
    import torch

    return not values.numel() or bool(torch.isfinite(torch.stack(torch.aminmax(values))).all())


def _check_finite_remote(values: torch.Tensor, codec: str) -> None:
    """RemoteProtocolError unless a peer's decoded ``values`` are all finite."""
    if not _all_finite(values):
        raise RemoteProtocolError(f"{codec} payload carries NaN or infinite values")


def _bytes_of(flat: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous 1-D tensor, sharing its memory."""
    import torch

    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _check_numel(numel: int) -> None:
    if not isinstance(numel, int) or numel < 0:
        raise LocalProtocolError(f"numel must be a non-negative int, got {numel!r}")


def _view(payload: bytes | bytearray | memoryview, codec: Codec, numel: int) -> memoryview:
    """The payload as a writable byte view, after checking its length."""
    _check_numel(numel)
    view = memoryview(payload).cast("B") if not isinstance(payload, memoryview) else payload
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    expected = codec.encoded_size(numel)
    if view.nbytes != expected:
        raise RemoteProtocolError(
            f"{codec.name} payload of {view.nbytes} bytes for {numel} values "
            f"(expected {expected})")
    if view.readonly:
        # torch cannot wrap a read-only buffer; frames arrive as bytearrays anyway.
        view = memoryview(bytearray(view))
    return view


def _raw_view(payload: bytes | bytearray | memoryview, codec: Codec, numel: int,
              dtype: str) -> torch.Tensor:
    """The payload's ``numel`` values of ``dtype`` (``Codec.decoded_view``)."""
    import torch

    view = _view(payload, codec, numel)
    if numel == 0:
        return torch.empty(0, dtype=getattr(torch, dtype))
    return torch.frombuffer(view, dtype=getattr(torch, dtype), count=numel)


def _output(numel: int, out: torch.Tensor | None) -> torch.Tensor:
    import torch

    if out is None:
        return torch.empty(numel, dtype=torch.float32)
    if (out.dtype != torch.float32 or out.device.type != "cpu" or out.numel() != numel
            or not out.is_contiguous()):
        raise LocalProtocolError(
            f"out must be a contiguous CPU float32 tensor of {numel} values")
    return out.view(-1)


@dataclasses.dataclass(frozen=True)
class Codec:
    """How float32 values travel.  Subclasses are stateless and frozen.

    ``encode(t)`` -> the payload (a memoryview that may share ``t``'s memory:
    keep ``t`` unchanged until it is sent).  ``decode(payload, numel)`` -> a
    1-D float32 tensor of ``numel`` finite values (for ``none`` it shares the
    payload's buffer; with ``out=`` it is written there; with ``trusted``,
    for a payload this node encoded itself, finiteness is not checked).
    ``encoded_size(numel)``: payload bytes.  ``error_bound(t)``: per value, the
    documented bound of ``|decode(encode(t)) - t|`` (float64; for checks,
    not the hot path), ``max_abs_error(t)`` its maximum and
    ``error_norm(t)`` its Euclidean norm, or a bound of it within a small
    factor (cheap: verification reads it per chunk; ``upper``, where the
    caller has it, is ``norm_upper(t)``).  ``reencodes``: whether
    ``encode(decode(payload))`` gives ``payload`` back byte for byte (so a
    receiver need not keep a payload to show it again).
    """

    name: ClassVar[str]
    reencodes: ClassVar[bool] = True
    #: whether decoded values are 0 but for a few per block (``topk``): a
    #: reducer then sends its own values through the codec too, so that a
    #: result is nonzero only where some contributor's values are
    sparse: ClassVar[bool] = False

    def encoded_size(self, numel: int) -> int:
        raise NotImplementedError

    def encode(self, t: torch.Tensor) -> memoryview:
        raise NotImplementedError

    def decode(self, payload: bytes | bytearray | memoryview, numel: int, *,
               out: torch.Tensor | None = None, trusted: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def decoded_view(self, payload: bytes | bytearray | memoryview, numel: int
                     ) -> torch.Tensor | None:
        """A payload this node encoded itself, as a tensor over its memory
        whose values converted to float32 are exactly what :meth:`decode`
        gives (``none``: float32; ``fp16``: float16), with no copy and no
        checks; None for codecs whose decoding computes (read it with
        :meth:`decode` then)."""
        return None

    def error_bound(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def max_abs_error(self, t: torch.Tensor) -> float:
        bound = self.error_bound(t)
        return float(bound.max()) if bound.numel() else 0.0

    def error_norm(self, t: torch.Tensor, upper: float | None = None) -> float:
        """The Euclidean norm of :meth:`error_bound` (codecs compute it without
        the per-value tensor where they can)."""
        import torch

        return float(torch.linalg.vector_norm(self.error_bound(t)))

    def meta(self) -> dict[str, Any] | None:
        """The codec's parameters for a TENSOR header's ``meta`` (None: none)."""
        return None

    def for_results(self, members: int) -> Codec:
        """The codec a reducer's results travel with in a group of ``members``
        (this one but for ``topk`` and ``qtopk``)."""
        return self


@dataclasses.dataclass(frozen=True)
class NoneCodec(Codec):
    """float32, little-endian, as is.  Exact."""

    name: ClassVar[str] = "none"

    def encoded_size(self, numel: int) -> int:
        return 4 * numel

    def encode(self, t: torch.Tensor) -> memoryview:
        flat = _as_float32(t)
        _check_finite_local(flat)
        return _bytes_of(flat)

    def decode(self, payload: bytes | bytearray | memoryview, numel: int, *,
               out: torch.Tensor | None = None, trusted: bool = False) -> torch.Tensor:
        import torch

        view = _view(payload, self, numel)
        if numel == 0:
            return _output(0, out)
        values = torch.frombuffer(view, dtype=torch.float32, count=numel)
        if not trusted:
            _check_finite_remote(values, "none")
        if out is None:
            return values
        return _output(numel, out).copy_(values)

    def decoded_view(self, payload: bytes | bytearray | memoryview, numel: int
                     ) -> torch.Tensor | None:
        return _raw_view(payload, self, numel, "float32")

    def error_bound(self, t: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.zeros(_as_float32(t).numel(), dtype=torch.float64)

    def error_norm(self, t: torch.Tensor, upper: float | None = None) -> float:
        return 0.0


@dataclasses.dataclass(frozen=True)
class Float16Codec(Codec):
    """IEEE half precision after clamping to ``+-65504``."""

    name: ClassVar[str] = "fp16"

    def encoded_size(self, numel: int) -> int:
        return 2 * numel

    def encode(self, t: torch.Tensor) -> memoryview:
        import torch

        flat = _as_float32(t)
        if flat.numel() == 0:
            return memoryview(b"")
        half = flat.to(torch.float16)
        # Checking the 2-byte result is cheaper; only on trouble look at why.
        if not _all_finite(half):
            _check_finite_local(flat)
            half = flat.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
        return _bytes_of(half)

    def decode(self, payload: bytes | bytearray | memoryview, numel: int, *,
               out: torch.Tensor | None = None, trusted: bool = False) -> torch.Tensor:
        import torch

        view = _view(payload, self, numel)
        result = _output(numel, out)
        if numel == 0:
            return result
        half = torch.frombuffer(view, dtype=torch.float16, count=numel)
        if not trusted:
            _check_finite_remote(half, "fp16")
        return result.copy_(half)

    def decoded_view(self, payload: bytes | bytearray | memoryview, numel: int
                     ) -> torch.Tensor | None:
        return _raw_view(payload, self, numel, "float16")

    def error_bound(self, t: torch.Tensor) -> torch.Tensor:
        import torch

        x = _as_float32(t).double().abs()
        rounding = torch.clamp(x * 2.0**-11, min=2.0**-25)
        return torch.where(x > FP16_MAX, x - FP16_MAX, rounding)

    def error_norm(self, t: torch.Tensor, upper: float | None = None) -> float:
        """While no value overflows, ``2^-11 * sqrt(|x|^2 + n * 2^-28)``
        (:func:`norm_upper` for ``|x|``): at least the norm of
        :meth:`error_bound`, ``|max(|x|, 2^-14) * 2^-11|``, and at most
        ``sqrt(2)`` times it (where values are below ``2^-14``), read with
        no temporary.  No value overflows where ``upper`` (``norm_upper(x)``)
        does not reach FP16_MAX: then the values are not read again."""
        import torch

        x = _as_float32(t)
        if x.numel() == 0:
            return 0.0
        if upper is None or not upper < FP16_MAX:
            low, high = torch.aminmax(x)
            if max(-float(low), float(high)) > FP16_MAX:
                return super().error_norm(t)
        if upper is None:
            upper = norm_upper(x)
        return math.sqrt(upper ** 2 + x.numel() * 2.0**-28) * 2.0**-11


@dataclasses.dataclass(frozen=True)
class Uint8Codec(Codec):
    """8-bit blockwise quantization with a float32 minimum and scale per block."""

    name: ClassVar[str] = "uint8"
    reencodes: ClassVar[bool] = False   # a block's range, decoded, may round otherwise
    #: Codes per block: 0 .. levels.
    levels: ClassVar[int] = 255
    _max_scale: ClassVar[float] = _UINT8_MAX_SCALE
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        if (not isinstance(self.block_size, int) or isinstance(self.block_size, bool)
                or not 1 <= self.block_size <= MAX_BLOCK_SIZE):
            raise ConfigError(
                f"block_size must be an int in [1, {MAX_BLOCK_SIZE}], got {self.block_size!r}")

    def blocks(self, numel: int) -> int:
        return -(-numel // self.block_size)

    def encoded_size(self, numel: int) -> int:
        return 8 * self.blocks(numel) + self._code_bytes(numel)

    @staticmethod
    def _code_bytes(numel: int) -> int:
        return numel

    def _codes_out(self, payload: torch.Tensor, blocks: int, numel: int) -> torch.Tensor:
        """Where ``encode`` writes one uint8 code per value."""
        return payload[8 * blocks:]

    def _pack(self, payload: torch.Tensor, blocks: int, codes: torch.Tensor) -> None:
        """Put the codes written in :meth:`_codes_out` into ``payload``."""

    def _codes_in(self, view: memoryview, blocks: int, numel: int) -> torch.Tensor:
        """One uint8 code per value, from a payload."""
        import torch

        return torch.frombuffer(view, dtype=torch.uint8, count=numel, offset=8 * blocks)

    def meta(self) -> dict[str, Any] | None:
        return {"block_size": self.block_size}

    def _block_stats(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per block minimum and maximum (NaN if the block has a NaN)."""
        import torch

        size, numel = self.block_size, flat.numel()
        full = numel // size
        mins, maxs = [], []
        if full:
            rows = flat[: full * size].view(full, size)
            # amin and amax apart: aminmax over a dimension is 6x slower.
            mins.append(rows.amin(1))
            maxs.append(rows.amax(1))
        if numel > full * size:
            tail = flat[full * size:]
            mins.append(tail.amin().reshape(1))
            maxs.append(tail.amax().reshape(1))
        return torch.cat(mins), torch.cat(maxs)

    def encode(self, t: torch.Tensor) -> memoryview:
        import torch

        flat = _as_float32(t)
        numel = flat.numel()
        if numel == 0:
            return memoryview(b"")
        lo, hi = self._block_stats(flat)
        if not bool(torch.isfinite(lo).all() and torch.isfinite(hi).all()):
            raise LocalProtocolError("cannot encode a tensor with NaN or infinite values "
                                     "(or float64 values beyond float32's range)")
        if bool(lo.min() < -UINT8_LIMIT) or bool(hi.max() > UINT8_LIMIT):
            flat = flat.clamp(-UINT8_LIMIT, UINT8_LIMIT)
            lo.clamp_(-UINT8_LIMIT, UINT8_LIMIT)
            hi.clamp_(-UINT8_LIMIT, UINT8_LIMIT)
        levels = self.levels
        scale = (hi - lo) / levels
        # Round the scale up where needed so that (x - lo) / scale never exceeds
        # the levels (rounding is monotonic): the codes then need no clamping.
        short = scale * levels < hi - lo
        scale = torch.where(short, torch.nextafter(scale, torch.full_like(scale, math.inf)),
                            scale)
        # Codes are trunc(1/2 + (x - lo) / scale), in [0, levels] as computed:
        # the conversion to uint8 truncates.  A constant block divides 0 by 1.
        divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
        half = torch.full((1, 1), 0.5)

        blocks = lo.numel()
        payload = torch.empty(self.encoded_size(numel), dtype=torch.uint8)
        payload[: 4 * blocks].view(torch.float32).copy_(lo)
        payload[4 * blocks: 8 * blocks].view(torch.float32).copy_(scale)
        codes = self._codes_out(payload, blocks, numel)
        size = self.block_size
        full = numel // size
        group = max(1, _GROUP_VALUES // size)
        work = torch.empty(min(full, group) * size, dtype=torch.float32)
        for first in range(0, full, group):
            count = min(group, full - first)
            rows = flat[first * size: (first + count) * size].view(count, size)
            tmp = work[: count * size].view(count, size)
            torch.sub(rows, lo[first: first + count, None], out=tmp)
            torch.addcdiv(half, tmp, divisor[first: first + count, None], out=tmp)
            codes[first * size: (first + count) * size].view(count, size).copy_(tmp)
        if numel > full * size:
            tail = (flat[full * size:] - lo[-1]) / divisor[-1] + 0.5
            codes[full * size:].copy_(tail)
        self._pack(payload, blocks, codes)
        return _bytes_of(payload)

    def decode(self, payload: bytes | bytearray | memoryview, numel: int, *,
               out: torch.Tensor | None = None, trusted: bool = False) -> torch.Tensor:
        import torch

        view = _view(payload, self, numel)
        result = _output(numel, out)
        if numel == 0:
            return result
        blocks = self.blocks(numel)
        lo = torch.frombuffer(view, dtype=torch.float32, count=blocks)
        scale = torch.frombuffer(view, dtype=torch.float32, count=blocks, offset=4 * blocks)
        # NaN fails every comparison, so these also reject NaN and infinities.
        if not bool((lo.abs() <= UINT8_LIMIT).all()):
            raise RemoteProtocolError(
                f"{self.name} payload has a block minimum that is not finite or beyond "
                f"+-{UINT8_LIMIT:g}")
        if not bool(((scale >= 0) & (scale <= self._max_scale)).all()):
            raise RemoteProtocolError(
                f"{self.name} payload has a block scale that is negative, not finite or "
                f"too large")
        codes = self._codes_in(view, blocks, numel)
        # With |lo| <= 2**125 and 0 <= scale <= 2**119 (uint8; 2**123 for uint4),
        # lo + levels * scale < 2**128: every decoded value is finite.
        size = self.block_size
        full = numel // size
        group = max(1, _GROUP_VALUES // size)
        for first in range(0, full, group):
            count = min(group, full - first)
            span = slice(first * size, (first + count) * size)
            torch.addcmul(lo[first: first + count, None], codes[span].view(count, size),
                          scale[first: first + count, None],
                          out=result[span].view(count, size))
        if numel > full * size:
            span = slice(full * size, numel)
            torch.addcmul(lo[-1], codes[span], scale[-1], out=result[span])
        return result

    def error_bound(self, t: torch.Tensor) -> torch.Tensor:
        import torch

        flat = _as_float32(t)
        if flat.numel() == 0:
            return torch.zeros(0, dtype=torch.float64)
        x = flat.double()
        clamped = x.clamp(-UINT8_LIMIT, UINT8_LIMIT)
        lo, hi = (s.double() for s in self._block_stats(flat.clamp(-UINT8_LIMIT, UINT8_LIMIT)))
        per_block = ((hi - lo) / (2 * self.levels) * (1 + 2.0**-12)
                     + 2.0**-23 * torch.maximum(lo.abs(), hi.abs()) + 2.0**-140)
        sizes = torch.full((lo.numel(),), self.block_size)
        sizes[-1] = flat.numel() - self.block_size * (lo.numel() - 1)
        return per_block.repeat_interleave(sizes) + (x - clamped).abs()


@dataclasses.dataclass(frozen=True)
class Uint4Codec(Uint8Codec):
    """4-bit blockwise quantization (16 levels), two codes per byte, with a
    float32 minimum and scale per block."""

    name: ClassVar[str] = "uint4"
    levels: ClassVar[int] = 15
    _max_scale: ClassVar[float] = _UINT4_MAX_SCALE
    block_size: int = DEFAULT_UINT4_BLOCK_SIZE

    @staticmethod
    def _code_bytes(numel: int) -> int:
        return (numel + 1) // 2

    def _codes_out(self, payload: torch.Tensor, blocks: int, numel: int) -> torch.Tensor:
        import torch

        # Room for an even count: the last code of an odd count pairs with a 0.
        codes = torch.empty(2 * self._code_bytes(numel), dtype=torch.uint8)
        codes[-1] = 0
        return codes[:numel]

    def _pack(self, payload: torch.Tensor, blocks: int, codes: torch.Tensor) -> None:
        import torch

        pairs = codes.as_strided((self._code_bytes(codes.numel()), 2), (2, 1))
        torch.bitwise_or(pairs[:, 0], pairs[:, 1] << 4, out=payload[8 * blocks:])

    def _codes_in(self, view: memoryview, blocks: int, numel: int) -> torch.Tensor:
        import torch

        packed = torch.frombuffer(view, dtype=torch.uint8, count=self._code_bytes(numel),
                                  offset=8 * blocks)
        if numel % 2 and int(packed[-1]) >> 4:
            raise RemoteProtocolError("uint4 payload has a code after its last value")
        codes = torch.empty((packed.numel(), 2), dtype=torch.uint8)
        torch.bitwise_and(packed, 15, out=codes[:, 0])
        torch.bitwise_right_shift(packed, 4, out=codes[:, 1])
        return codes.view(-1)[:numel]


@dataclasses.dataclass(frozen=True)
class TopKCodec(Codec):
    """Blockwise top-k sparsification: per block of ``block_size`` values,
    the ``k`` of largest magnitude (their positions and fp16 values); the
    others decode as 0.

    A result is the average of at most as many contributors' values as the
    group has members, each ``k``-sparse per block, so it is nonzero only on
    the union of their positions: :meth:`for_results` gives the codec that
    carries it without dropping anything (``k`` times the members per
    block, at most the block).
    """

    name: ClassVar[str] = "topk"
    reencodes: ClassVar[bool] = False   # a kept 0 may re-encode at another position
    sparse: ClassVar[bool] = True
    block_size: int = DEFAULT_TOPK_BLOCK_SIZE
    k: int = DEFAULT_TOPK_K

    def __post_init__(self) -> None:
        for name, value, top in (("block_size", self.block_size, MAX_TOPK_BLOCK_SIZE),
                                 ("k", self.k, self.block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise ConfigError(f"topk {name} must be an int in [1, {top}], got {value!r}")

    def meta(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "k": self.k}

    def for_results(self, members: int) -> Codec:
        return TopKCodec(self.block_size, min(self.block_size, max(1, members) * self.k))

    def _kept(self, numel: int) -> tuple[int, int, int]:
        """(full blocks, values of the last short block, entries in all)."""
        full, rest = divmod(numel, self.block_size)
        return full, rest, full * self.k + min(self.k, rest)

    def encoded_size(self, numel: int) -> int:
        return 4 * self._kept(numel)[2]

    def encode(self, t: torch.Tensor) -> memoryview:
        import torch

        flat = _as_float32(t)
        _check_finite_local(flat)
        full, rest, entries = self._kept(flat.numel())
        if entries == 0:
            return memoryview(b"")
        payload = torch.empty(4 * entries, dtype=torch.uint8)
        self._select_all(flat, payload[:2 * entries].view(torch.int16),
                         payload[2 * entries:].view(torch.float16))
        return memoryview(payload.numpy()).cast("B")

    def _select_all(self, flat: torch.Tensor, positions: torch.Tensor,
                    values: torch.Tensor) -> None:
        """Every block's kept entries of ``flat`` into ``positions`` and
        ``values`` (one per entry, blocks in order)."""
        full, rest, _ = self._kept(flat.numel())
        width, k = self.block_size, self.k
        step = max(1, _GROUP_VALUES // width)   # blocks at a time: their temporaries fit in cache
        for lo in range(0, full, step):
            hi = min(full, lo + step)
            blocks = flat[lo * width:hi * width].view(hi - lo, width)
            self._select(blocks, k, positions[lo * k:hi * k].view(hi - lo, k),
                         values[lo * k:hi * k].view(hi - lo, k))
        if rest:
            kept = min(k, rest)
            self._select(flat[full * width:].view(1, rest), kept,
                         positions[full * k:].view(1, kept), values[full * k:].view(1, kept))

    @staticmethod
    def _select(blocks: torch.Tensor, k: int, positions: torch.Tensor,
                values: torch.Tensor) -> None:
        """Per row of ``blocks``, its ``k`` values of largest magnitude (ties:
        torch's order, the same on every machine of a build), positions
        ascending, into ``positions`` (uint16 as int16, or uint8) and
        ``values`` (clamped to fp16's range)."""
        import torch

        chosen = torch.topk(blocks.abs(), k, dim=1, sorted=False).indices.sort(dim=1).values
        positions.copy_(chosen.to(torch.int32).to(positions.dtype))
        values.copy_(blocks.gather(1, chosen).clamp(-FP16_MAX, FP16_MAX))

    def _entries(self, view: memoryview, numel: int, trusted: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The payload's positions (int64, within each block) and values (fp16),
        checked: positions strictly ascending within a block and inside it,
        values finite."""
        import torch

        full, rest, entries = self._kept(numel)
        positions = torch.frombuffer(view, dtype=torch.int16, count=entries)
        positions = positions.to(torch.int64).bitwise_and_(0xFFFF)
        values = torch.frombuffer(view, dtype=torch.float16, count=entries,
                                  offset=2 * entries)
        if trusted:
            return positions, values
        _check_finite_remote(values, "topk")
        self._check_positions(positions, numel)
        return positions, values

    def _check_positions(self, positions: torch.Tensor, numel: int) -> None:
        """RemoteProtocolError unless ``positions`` (int64, one per entry) are
        strictly ascending within each block and inside it."""
        full, rest, _ = self._kept(numel)
        k = self.k
        rows = [(positions[:full * k].view(full, k), self.block_size)] if full else []
        if rest:
            rows.append((positions[full * k:].view(1, -1), rest))
        for block, width in rows:
            if int(block.max()) >= width or (block.shape[1] > 1 and not bool(
                    (block[:, 1:] > block[:, :-1]).all())):
                raise RemoteProtocolError(f"{self.name} payload positions are not ascending "
                                          f"within their blocks")

    def decode(self, payload: bytes | bytearray | memoryview, numel: int, *,
               out: torch.Tensor | None = None, trusted: bool = False) -> torch.Tensor:
        view = _view(payload, self, numel)
        result = _output(numel, out)
        if numel == 0:
            return result
        positions, values = self._entries(view, numel, trusted)
        return self._place(positions, values.float(), result.zero_())

    def _place(self, positions: torch.Tensor, source: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
        """``source`` (one per entry) written into ``out`` at the entries'
        positions, block by block; ``out``."""
        full, rest, _ = self._kept(out.numel())
        k, width = self.k, self.block_size
        if full:
            out[:full * width].view(full, width).scatter_(
                1, positions[:full * k].view(full, k), source[:full * k].view(full, k))
        if rest:
            out[full * width:].scatter_(0, positions[full * k:], source[full * k:])
        return out

    def kept_mask(self, t: torch.Tensor) -> torch.Tensor:
        """Where :meth:`encode` keeps a value of ``t`` (bool, one per value)."""
        import torch

        flat = _as_float32(t)
        mask = torch.zeros(flat.numel(), dtype=torch.bool)
        if flat.numel():
            positions, _ = self._entries(self.encode(flat), flat.numel(), trusted=True)
            self._place(positions, torch.ones(positions.numel(), dtype=torch.bool), mask)
        return mask

    def error_bound(self, t: torch.Tensor) -> torch.Tensor:
        """A dropped value's own magnitude; a kept one's fp16 rounding."""
        import torch

        x = _as_float32(t)
        return torch.where(self.kept_mask(x), Float16Codec().error_bound(x),
                           x.double().abs())


@dataclasses.dataclass(frozen=True)
class QTopKCodec(TopKCodec):
    """Blockwise top-k with low-bit values: ``topk``'s choice of values,
    each kept value quantized to ``bits`` bits on its block's grid, from
    the kept values' minimum to their maximum (an fp16 minimum and step per
    block); at ``bits=16`` the kept values travel as fp16.  Positions take
    one byte in blocks of at most 256 values.

    At the defaults (blocks of 256, 8 kept, 2 bits) a block costs 4 bytes of
    grid, 8 positions and 2 bytes of codes: 0.055 bytes per value.  Results
    travel as ``qtopk`` with ``k`` times the members per block (the union
    of the contributors' positions) and 16 bits: 3 bytes per value kept.  A
    result is an average, off the contributors' grids, and verification
    reads its codec's rounding as slack: a coarse result grid would let a
    lying reducer hide in it.
    """

    name: ClassVar[str] = "qtopk"
    block_size: int = DEFAULT_TOPK_BLOCK_SIZE
    k: int = DEFAULT_TOPK_K
    bits: int = DEFAULT_QTOPK_BITS

    def __post_init__(self) -> None:
        super().__post_init__()
        if (not isinstance(self.bits, int) or isinstance(self.bits, bool)
                or self.bits not in QTOPK_BITS):
            raise ConfigError(f"qtopk bits must be one of {QTOPK_BITS}, got {self.bits!r}")

    @property
    def levels(self) -> int:
        """The highest code of a grid: codes run 0 .. levels."""
        return 2**self.bits - 1

    def meta(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "k": self.k, "bits": self.bits}

    def for_results(self, members: int) -> Codec:
        return QTopKCodec(self.block_size, min(self.block_size, max(1, members) * self.k), 16)

    def _layout(self, numel: int) -> tuple[int, int, int, int, int]:
        """(blocks, entries, bytes per position, offset of the positions,
        offset of the codes)."""
        full, rest, entries = self._kept(numel)
        blocks = full + (1 if rest else 0)
        width = 1 if self.block_size <= 256 else 2
        head = 2 * entries if self.bits == 16 else 4 * blocks
        return blocks, entries, width, head, head + width * entries

    def encoded_size(self, numel: int) -> int:
        _, entries, _, _, codes = self._layout(numel)
        return codes + (0 if self.bits == 16 else -(-entries * self.bits // 8))

    def _owners(self, numel: int) -> torch.Tensor:
        """The block of each entry (int64, one per entry)."""
        import torch

        full, rest, entries = self._kept(numel)
        owner = torch.arange(full).repeat_interleave(self.k)
        if rest:
            owner = torch.cat([owner, torch.full((entries - full * self.k,), full)])
        return owner

    def _grids(self, values: torch.Tensor, owner: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per block, from its kept ``values`` (float32, one per entry, and
        ``owner``, the block of each): its grid's fp16 minimum and step."""
        import torch

        blocks = int(owner[-1]) + 1
        lo = torch.full((blocks,), math.inf).scatter_reduce_(0, owner, values, "amin")
        hi = torch.full((blocks,), -math.inf).scatter_reduce_(0, owner, values, "amax")
        # The minimum is lo rounded down to fp16, the step the range over the
        # levels rounded up: the grid spans [lo, hi] as decoded.
        low = lo.half()
        low = torch.where(low.float() > lo, torch.nextafter(low, torch.full_like(low, -math.inf)),
                          low)
        step = ((hi - low.float()) / self.levels).half()
        for _ in range(4):   # once is enough but where float32 rounding disagrees
            short = low.float() + step.float() * self.levels < hi
            if not bool(short.any()):
                break
            step = torch.where(short, torch.nextafter(step, torch.full_like(step, math.inf)),
                               step)
        return low, step

    def _positions(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        """Where a payload (uint8) holds its positions, as uint8 or int16."""
        import torch

        _, _, width, start, end = self._layout(numel)
        positions = payload[start:end]
        return positions.view(torch.int16) if width == 2 else positions

    def encode(self, t: torch.Tensor) -> memoryview:
        import torch

        flat = _as_float32(t)
        _check_finite_local(flat)
        numel = flat.numel()
        blocks, entries, _, head, offset = self._layout(numel)
        if entries == 0:
            return memoryview(b"")
        payload = torch.empty(self.encoded_size(numel), dtype=torch.uint8)
        positions = self._positions(payload, numel)
        if self.bits == 16:
            self._select_all(flat, positions, payload[:head].view(torch.float16))
            return memoryview(payload.numpy()).cast("B")
        values = torch.empty(entries, dtype=torch.float32)
        self._select_all(flat, positions, values)
        owner = self._owners(numel)
        low, step = self._grids(values, owner)
        payload[:2 * blocks].view(torch.float16).copy_(low)
        payload[2 * blocks:head].view(torch.float16).copy_(step)
        low, step = low.float()[owner], step.float()[owner]
        divisor = torch.where(step > 0, step, torch.ones_like(step))
        codes = ((values - low) / divisor + 0.5).clamp_(0, self.levels).to(torch.uint8)
        per = 8 // self.bits
        padded = torch.zeros(-(-entries // per) * per, dtype=torch.uint8)
        padded[:entries] = codes
        columns = padded.view(-1, per)
        packed = payload[offset:]
        packed.copy_(columns[:, 0])
        for j in range(1, per):
            packed.bitwise_or_(columns[:, j] << (self.bits * j))
        return memoryview(payload.numpy()).cast("B")

    def _entries(self, view: memoryview, numel: int, trusted: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The payload's positions (int64, within each block) and values
        (float32), checked: the grids finite with steps not negative (or the
        fp16 values finite), positions as ``topk``'s, no code after the last
        entry."""
        import torch

        blocks, entries, width, head, offset = self._layout(numel)
        payload = torch.frombuffer(view, dtype=torch.uint8)
        positions = self._positions(payload, numel).to(torch.int64).bitwise_and_(0xFFFF)
        if not trusted:
            self._check_positions(positions, numel)
        if self.bits == 16:
            values = payload[:head].view(torch.float16)
            if not trusted:
                _check_finite_remote(values, "qtopk")
            return positions, values.float()
        low = payload[:2 * blocks].view(torch.float16)
        step = payload[2 * blocks:head].view(torch.float16)
        per = 8 // self.bits
        packed = payload[offset:]
        codes = torch.stack([(packed >> (self.bits * j)) & self.levels for j in range(per)],
                            dim=1).view(-1)
        if not trusted:
            # NaN fails every comparison: these reject NaN and infinities too.
            if not bool((low.abs() <= FP16_MAX).all()
                        and ((step >= 0) & (step <= FP16_MAX)).all()):
                raise RemoteProtocolError("qtopk payload has a block grid that is not finite "
                                          "or has a negative step")
            if bool(codes[entries:].any()):
                raise RemoteProtocolError("qtopk payload has a code after its last entry")
        # |low| <= 65504 and 0 <= step <= 65504: every value is finite.
        owner = self._owners(numel)
        values = torch.addcmul(low.float()[owner], codes[:entries].float(), step.float()[owner])
        return positions, values

    def error_bound(self, t: torch.Tensor) -> torch.Tensor:
        """A dropped value's own magnitude; a kept one's half a step of its
        block's grid (with float32 rounding; at 16 bits, fp16's rounding),
        plus what clamping to fp16's range took."""
        import torch

        if self.bits == 16:
            return super().error_bound(t)
        x = _as_float32(t)
        bound = x.double().abs()
        if x.numel() == 0:
            return bound
        _, entries, width, _, _ = self._layout(x.numel())
        positions = torch.empty(entries, dtype=torch.int16 if width == 2 else torch.uint8)
        values = torch.empty(entries, dtype=torch.float32)
        self._select_all(x, positions, values)
        owner = self._owners(x.numel())
        low, step = self._grids(values, owner)
        low, step = low.double()[owner], step.double()[owner]
        top = low + self.levels * step
        kept = (step / 2 * (1 + 2.0**-12) + 2.0**-23 * torch.maximum(low.abs(), top.abs())
                + 2.0**-140)
        positions = positions.to(torch.int64).bitwise_and_(0xFFFF)
        mask = self._place(positions, torch.ones(entries, dtype=torch.bool),
                           torch.zeros(x.numel(), dtype=torch.bool))
        per_value = self._place(positions, kept, torch.zeros(x.numel(), dtype=torch.float64))
        clamped = (bound - FP16_MAX).clamp_(min=0)
        return torch.where(mask, per_value + clamped, bound)

#: The codecs by name, with their default parameters.
CODECS: dict[str, Codec] = {
    NoneCodec.name: NoneCodec(),
    Float16Codec.name: Float16Codec(),
    Uint8Codec.name: Uint8Codec(),
    Uint4Codec.name: Uint4Codec(),
    TopKCodec.name: TopKCodec(),
    QTopKCodec.name: QTopKCodec(),
}
#: The codecs that take a ``block_size``.
_BLOCKED: dict[str, type[Uint8Codec]] = {Uint8Codec.name: Uint8Codec,
                                         Uint4Codec.name: Uint4Codec}
#: The sparse codecs, whose parameters are their fields (``meta``).
_SPARSE: dict[str, type[TopKCodec]] = {TopKCodec.name: TopKCodec, QTopKCodec.name: QTopKCodec}


def get_codec(name: str, block_size: int | None = None) -> Codec:
    """The codec called ``name``; ``block_size`` is for ``uint8`` and
    ``uint4`` (None: theirs, 4096 and 256; ``topk`` and ``qtopk`` come with
    their defaults: build :class:`TopKCodec` or :class:`QTopKCodec` for
    others).  ConfigError if unknown."""
    if name not in CODECS:
        raise ConfigError(f"unknown codec {name!r}; known: {', '.join(CODECS)}")
    if name in _BLOCKED and block_size is not None:
        return _BLOCKED[name](block_size)
    return CODECS[name]


def codec_from_header(name: str, meta: dict[str, Any] | None) -> Codec:
    """The codec a peer's TENSOR header names; RemoteProtocolError if it is not valid."""
    if name not in CODECS:
        raise RemoteProtocolError(f"unknown codec {name!r}")
    if name not in _BLOCKED and name not in _SPARSE:
        if meta:
            raise RemoteProtocolError(f"codec {name!r} takes no parameters, got {meta!r}")
        return CODECS[name]
    if name in _SPARSE:
        kind = _SPARSE[name]
        keys = set(CODECS[name].meta())
        if not isinstance(meta, dict) or set(meta) != keys:
            raise RemoteProtocolError(f"codec {name!r} needs exactly {', '.join(sorted(keys))}, "
                                      f"got {meta!r}")
        try:
            return kind(**meta)
        except ConfigError as exc:
            raise RemoteProtocolError(str(exc)) from None
    if not isinstance(meta, dict) or set(meta) != {"block_size"}:
        raise RemoteProtocolError(f"codec {name!r} needs exactly a block_size, got {meta!r}")
    try:
        return get_codec(name, meta["block_size"])
    except ConfigError as exc:
        raise RemoteProtocolError(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class CodecPolicy:
    """Which codec a tensor travels with, by its number of values.

    ``small`` (default ``none``) for tensors of fewer than ``threshold``
    values (default ``2**16``: biases and norms, exact and cheap), ``large``
    (default ``fp16``: half the bytes at a relative error of ``2**-11``)
    for the rest.  ``block_size`` is for ``uint8`` and ``uint4`` (None:
    theirs, 4096 and 256 values).
    """

    small: str = "none"
    large: str = "fp16"
    threshold: int = 2**16
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.block_size is not None:
            Uint8Codec(self.block_size)
        for name in (self.small, self.large):
            get_codec(name, self.block_size)
        if not isinstance(self.threshold, int) or self.threshold < 0:
            raise ConfigError(f"threshold must be a non-negative int, got {self.threshold!r}")


def choose_codec(numel: int, policy: CodecPolicy = CodecPolicy()) -> Codec:
    """The codec ``policy`` gives a tensor of ``numel`` values."""
    _check_numel(numel)
    name = policy.small if numel < policy.threshold else policy.large
    return get_codec(name, policy.block_size)
