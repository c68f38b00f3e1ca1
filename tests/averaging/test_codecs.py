"""The all-reduce's tensor codecs (sans-IO): round trips, error bounds, strict decoding."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from p2pdl.averaging import (
    CODECS,
    CodecPolicy,
    Float16Codec,
    NoneCodec,
    QTopKCodec,
    TopKCodec,
    Uint4Codec,
    Uint8Codec,
    choose_codec,
    codec_from_header,
    get_codec,
)
from p2pdl.averaging._codecs import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_TOPK_BLOCK_SIZE,
    DEFAULT_TOPK_K,
    DEFAULT_UINT4_BLOCK_SIZE,
    FP16_MAX,
    UINT8_LIMIT,
)
from p2pdl.averaging._norms import norm_upper
from p2pdl.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from p2pdl.wire import TensorHeader
from p2pdl.wire._tensor import decode_tensor_frame, encode_tensor_frame
from p2pdl.wire.config import FRAME_HEADER_SIZE

FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)
# Values of one scale with an occasional outlier: what gradients look like.
MODERATE = st.one_of(st.floats(-10, 10, width=32), FLOATS)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40)
ALL = [NoneCodec(), Float16Codec(), Uint8Codec(), Uint8Codec(block_size=7), Uint4Codec(),
       Uint4Codec(block_size=7), TopKCodec(), TopKCodec(block_size=7, k=3), QTopKCodec(),
       QTopKCodec(block_size=7, k=3), QTopKCodec(block_size=300, k=5, bits=4),
       QTopKCodec(block_size=16, k=16, bits=8), QTopKCodec(block_size=300, k=7, bits=16),
       QTopKCodec(block_size=9, k=2, bits=16)]


def tensors(elements=MODERATE):
    return hnp.arrays(np.float32, SHAPES, elements=elements).map(torch.from_numpy)


def roundtrip(codec, t):
    payload = codec.encode(t)
    assert len(payload) == codec.encoded_size(t.numel())
    y = codec.decode(payload, t.numel())
    assert y.dtype == torch.float32 and y.shape == (t.numel(),)
    assert bool(torch.isfinite(y).all())
    return y


def error(t, y):
    return (y.double() - t.detach().reshape(-1).float().double()).abs()


# -- error bounds ------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(tensors(FLOATS))
def test_none_is_exact(t):
    y = roundtrip(NoneCodec(), t)
    assert torch.equal(y, t.reshape(-1))
    assert NoneCodec().max_abs_error(t) == 0.0


@settings(max_examples=300, deadline=None)
@given(tensors(st.one_of(FLOATS, st.floats(-2.0**-13, 2.0**-13, width=32))))
def test_fp16_error_is_within_its_documented_bound(t):
    y = roundtrip(Float16Codec(), t)
    x = t.reshape(-1).double().abs()
    bound = torch.where(x > FP16_MAX, x - FP16_MAX,
                        torch.maximum(x * 2.0**-11, torch.full_like(x, 2.0**-25)))
    assert bool((error(t, y) <= bound).all())
    assert bool((y.abs() <= FP16_MAX).all())
    assert torch.equal(Float16Codec().error_bound(t), bound)
    # Its norm, computed without the per-value tensor, bounds the same
    # bound's norm within sqrt(2) (and float32 sums' 0.2 %).
    exact = float(torch.linalg.vector_norm(bound))
    assert exact * (1 - 1e-9) <= Float16Codec().error_norm(t) <= math.sqrt(2) * exact * 1.002
    # Given norm_upper(t) (verification has it), the same bound.
    upper = norm_upper(t.reshape(-1).float())
    assert Float16Codec().error_norm(t, upper) == Float16Codec().error_norm(t)


@pytest.mark.parametrize("codec", [NoneCodec(), Float16Codec()])
def test_a_trusted_payload_is_not_checked_for_finiteness(codec):
    """A node's own encoding is decoded without the finiteness check; a
    remote payload with NaN is a protocol error."""
    values = torch.tensor([1.0, 2.0, 3.0])
    payload = bytearray(codec.encode(values))
    assert torch.equal(codec.decode(bytes(payload), 3, trusted=True), values)
    nan = struct.pack("<e" if codec.name == "fp16" else "<f", math.nan)
    payload[:len(nan)] = nan
    with pytest.raises(RemoteProtocolError):
        codec.decode(bytes(payload), 3)
    assert math.isnan(float(codec.decode(bytes(payload), 3, trusted=True)[0]))


@settings(max_examples=300, deadline=None)
@given(tensors(st.one_of(MODERATE, st.floats(-2.0**-130, 2.0**-130, width=32))),
       st.sampled_from([(Uint8Codec, 510), (Uint4Codec, 30)]),
       st.sampled_from([1, 2, 5, 64, DEFAULT_UINT4_BLOCK_SIZE, DEFAULT_BLOCK_SIZE]))
def test_blockwise_error_is_within_half_a_step_per_block(t, kind, block_size):
    """uint8 (255 levels: half a step is the range / 510) and uint4 (15: / 30)."""
    make, steps = kind
    codec = make(block_size)
    y = roundtrip(codec, t)
    flat = t.reshape(-1).double()
    err = error(t, y)
    assert bool((err <= codec.error_bound(t)).all())
    # The same bound, block by block, written out from the docstring.
    clamped = flat.clamp(-UINT8_LIMIT, UINT8_LIMIT)
    for start in range(0, flat.numel(), block_size):
        block = clamped[start:start + block_size]
        lo, hi = float(block.min()), float(block.max())
        bound = (hi - lo) / steps * (1 + 2**-12) + 2**-23 * max(abs(lo), abs(hi)) + 2**-140
        beyond = (flat[start:start + block_size] - block).abs()
        assert bool((err[start:start + block_size] <= bound + beyond).all())


def test_uint4_packs_two_codes_per_byte_low_first():
    """One block [0, 15] of 5 values, codes 1, 15, 4, 0, 15: bytes 0xF1, 0x04, 0x0F."""
    t = torch.tensor([1.0, 15.0, 4.0, 0.0, 15.0])
    payload = bytes(Uint4Codec(5).encode(t))
    assert payload == struct.pack("<2f", 0.0, 1.0) + bytes([0xF1, 0x04, 0x0F])
    assert Uint4Codec(5).decode(payload, 5).tolist() == t.tolist()
    # An odd count leaves the last high four bits 0; others are refused.
    with pytest.raises(RemoteProtocolError, match="after its last value"):
        Uint4Codec(5).decode(payload[:-1] + bytes([0x1F]), 5)
    assert Uint4Codec().encoded_size(10_000_000) == 5_000_000 + 8 * 39063


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 3 * 97 + 5), st.floats(-1024, 1024, width=32), st.floats(1e-3, 1e3))
def test_uint8_quantizes_to_the_grid_of_its_block(numel, offset, spread):
    t = torch.linspace(offset, offset + spread, numel)
    y = roundtrip(Uint8Codec(97), t)
    lo, hi = float(t[:97].min()), float(t[:97].max())
    assert float(error(t[:97], y[:97]).max()) <= (hi - lo) / 510 * 1.001 + 2**-23 * 1e3


def test_max_abs_error_is_the_largest_bound():
    t = torch.tensor([0.0, 1.0, 1000.0, 1e5])
    assert NoneCodec().max_abs_error(t) == 0
    assert Float16Codec().max_abs_error(t) == 1e5 - FP16_MAX
    assert Uint8Codec().max_abs_error(t) == pytest.approx(1e5 / 510, rel=1e-3)
    assert Uint8Codec().max_abs_error(torch.empty(0)) == 0.0


# -- edge cases --------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
def test_empty_and_single_values(codec):
    assert len(codec.encode(torch.empty(0))) == codec.encoded_size(0) == 0
    assert codec.decode(b"", 0).shape == (0,)
    assert codec.decode(bytearray(), 0, out=torch.empty(0)).shape == (0,)
    for value in (0.0, -3.25, 1e-30):
        y = roundtrip(codec, torch.tensor(value))
        assert float(error(torch.tensor([value]), y)[0]) <= codec.max_abs_error(
            torch.tensor(value))


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
def test_constant_blocks_decode_exactly(codec):
    # Two full blocks then a partial one (for uint8); fp16-exact values.
    if codec.sparse:
        return   # topk keeps k values of a block, however alike
    size = getattr(codec, "block_size", 5)
    t = torch.tensor([1.5] * size + [-2.0] * size + [0.0] * 3)
    assert torch.equal(roundtrip(codec, t), t)


def test_uint8_constant_block_has_scale_zero_and_a_partial_last_block():
    codec = Uint8Codec(4)
    t = torch.tensor([3.0] * 4 + [0.0, 1.0, 2.0])  # one full block, one of 3
    payload = bytes(codec.encode(t))
    mins = struct.unpack("<2f", payload[:8])
    scales = struct.unpack("<2f", payload[8:16])
    assert mins == (3.0, 0.0)
    assert scales[0] == 0.0 and scales[1] == pytest.approx(2 / 255)
    # 1.0 is half way: 127 or 128 as float32 rounding falls.
    assert list(payload[16:21]) == [0] * 5 and payload[21] in (127, 128) and payload[22] == 255
    assert len(payload) == codec.encoded_size(7) == 8 * 2 + 7


def test_fp16_clamps_huge_values_instead_of_sending_infinity():
    t = torch.tensor([1e10, -3e38, 65519.0, 65520.0, 1.0])
    payload = bytes(Float16Codec().encode(t))
    assert not any(math.isinf(v) for (v,) in struct.iter_unpack("<e", payload))
    y = roundtrip(Float16Codec(), t)
    assert y.tolist() == [FP16_MAX, -FP16_MAX, FP16_MAX, FP16_MAX, 1.0]


def test_uint8_clamps_values_beyond_its_limit():
    t = torch.tensor([3e38, -3e38, 0.0, 1e30])
    y = roundtrip(Uint8Codec(), t)
    assert float(y.max()) <= UINT8_LIMIT * (1 + 2**-20)
    assert float(y.min()) >= -UINT8_LIMIT * (1 + 2**-20)
    assert bool((error(t, y) <= Uint8Codec().error_bound(t)).all())
    # Huge but in range: the block's own resolution, nothing overflows.
    t = torch.tensor([-4e37, 4e37, 1.0])
    assert bool((error(t, roundtrip(Uint8Codec(), t)) <= Uint8Codec().error_bound(t)).all())


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
def test_non_contiguous_and_other_dtypes_are_read_as_float32(codec):
    base = torch.randn(30, 20)
    for t in (base.t(), base[:, ::3], base[::2, 5]):
        assert not t.is_contiguous()
        y = roundtrip(codec, t)
        assert bool((error(t, y) <= codec.error_bound(t)).all())
        assert torch.equal(y, roundtrip(codec, t.contiguous()))
    for dtype in (torch.bfloat16, torch.float64, torch.float16):
        t = base.to(dtype)
        y = roundtrip(codec, t)
        assert torch.equal(y, roundtrip(codec, t.float()))
    with pytest.raises(LocalProtocolError):
        codec.encode(torch.arange(4))
    with pytest.raises(LocalProtocolError):
        codec.encode([1.0, 2.0])


def test_none_encodes_without_copying():
    t = torch.arange(8, dtype=torch.float32)
    payload = NoneCodec().encode(t)
    t[0] = 42.0
    assert struct.unpack_from("<f", payload)[0] == 42.0


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
def test_decoding_into_out(codec):
    t = torch.randn(100)
    out = torch.full((100,), math.nan)
    result = codec.decode(codec.encode(t), 100, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(out, roundtrip(codec, t))
    for bad in (torch.empty(99), torch.empty(100, dtype=torch.float64),
                torch.empty(200)[::2]):
        with pytest.raises(LocalProtocolError):
            codec.decode(codec.encode(t), 100, out=bad)


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
def test_read_only_and_unaligned_payloads_decode(codec):
    t = torch.randn(50)
    payload = bytes(codec.encode(t))
    expected = roundtrip(codec, t)
    assert torch.equal(codec.decode(payload, 50), expected)
    shifted = memoryview(bytearray(b"x" + payload))[1:]  # as inside a frame
    assert torch.equal(codec.decode(shifted, 50), expected)


# -- encoding what cannot be sent --------------------------------------------


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", [0, 9, 19])
def test_encoding_nan_or_infinity_is_a_local_error(codec, bad, where):
    t = torch.randn(20)
    t[where] = bad
    with pytest.raises(LocalProtocolError, match="NaN or infinite"):
        codec.encode(t)


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
def test_float64_beyond_float32_is_a_local_error(codec):
    with pytest.raises(LocalProtocolError):
        codec.encode(torch.tensor([1.0, 1e300], dtype=torch.float64))


# -- strict decoding ---------------------------------------------------------


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
def test_wrong_payload_length_is_a_remote_error(codec):
    payload = bytes(codec.encode(torch.randn(20)))
    for wrong in (payload[:-1], payload + b"\0", b""):
        with pytest.raises(RemoteProtocolError, match="payload of"):
            codec.decode(wrong, 20)
    if not codec.sparse:   # (topk: 20 and 21 values may keep as many)
        with pytest.raises(RemoteProtocolError):
            codec.decode(payload, 21)
    with pytest.raises(LocalProtocolError):
        codec.decode(payload, -1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_none_and_fp16_payloads_are_rejected(bad):
    with pytest.raises(RemoteProtocolError, match="NaN or infinite"):
        NoneCodec().decode(struct.pack("<3f", 1.0, bad, 2.0), 3)
    with pytest.raises(RemoteProtocolError, match="NaN or infinite"):
        Float16Codec().decode(struct.pack("<3e", 1.0, 2.0, bad), 3)


def uint8_payload(mins, scales, codes):
    return struct.pack(f"<{len(mins)}f{len(scales)}f", *mins, *scales) + bytes(codes)


def test_a_well_formed_uint8_payload_decodes():
    y = Uint8Codec(2).decode(uint8_payload([1.0, -4.0], [0.5, 0.0], [0, 2, 255]), 3)
    assert y.tolist() == [1.0, 2.0, -4.0]


@pytest.mark.parametrize("mins, scales, message", [
    ([math.nan, 0.0], [1.0, 1.0], "minimum"),
    ([0.0, math.inf], [1.0, 1.0], "minimum"),
    ([-math.inf, 0.0], [1.0, 1.0], "minimum"),
    ([0.0, 3e38], [1.0, 1.0], "minimum"),
    ([0.0, 0.0], [math.nan, 1.0], "scale"),
    ([0.0, 0.0], [1.0, math.inf], "scale"),
    ([0.0, 0.0], [-1.0, 1.0], "scale"),
    ([0.0, 0.0], [1.0, -1e-45], "scale"),
    ([0.0, 0.0], [1.0, 1e37], "scale"),
])
def test_bad_uint8_blocks_are_rejected(mins, scales, message):
    with pytest.raises(RemoteProtocolError, match=message):
        Uint8Codec(2).decode(uint8_payload(mins, scales, [7, 7, 7]), 3)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_decoding_garbage_never_yields_nan_or_infinity(data):
    codec = data.draw(st.sampled_from(ALL))
    numel = data.draw(st.integers(0, 30))
    size = codec.encoded_size(numel)
    if codec.name in ("uint8", "uint4"):
        # Mostly plausible floats for the block headers, so that some pass.
        blocks = codec.blocks(numel)
        head = data.draw(st.lists(st.floats(width=32), min_size=2 * blocks,
                                  max_size=2 * blocks))
        codes = size - 8 * blocks
        payload = struct.pack(f"<{2 * blocks}f", *head) + data.draw(
            st.binary(min_size=codes, max_size=codes))
    else:
        payload = data.draw(st.binary(min_size=size, max_size=size))
    try:
        y = codec.decode(payload, numel)
    except RemoteProtocolError:
        return
    assert bool(torch.isfinite(y).all())


@settings(max_examples=100, deadline=None)
@given(tensors(), st.sampled_from([TopKCodec(), TopKCodec(block_size=7, k=3),
                                   TopKCodec(block_size=16, k=16)]))
def test_topk_keeps_the_largest_values_of_each_block(t, codec):
    """At most k values per block survive, each the fp16 rounding of its
    value, and no dropped value is larger than a kept one of its block."""
    flat = t.reshape(-1)
    y = roundtrip(codec, t).reshape(-1)
    kept = codec.kept_mask(flat)
    assert bool((y[~kept] == 0).all())
    for lo in range(0, flat.numel(), codec.block_size):
        block, mask = flat[lo:lo + codec.block_size], kept[lo:lo + codec.block_size]
        assert int(mask.sum()) == min(codec.k, block.numel())
        if (~mask).any() and mask.any():
            assert float(block[~mask].abs().max()) <= float(block[mask].abs().min())
    err = (y.double() - flat.double()).abs()
    assert bool((err <= codec.error_bound(flat)).all())


def test_topk_results_carry_the_union_of_the_contributors_positions():
    """A combination of n k-sparse vectors has at most n k nonzeros per block:
    the result codec drops none of them (fp16 values stay as they are)."""
    codec = TopKCodec(block_size=64, k=4)
    gen = torch.Generator().manual_seed(3)
    decoded = [codec.decode(codec.encode(torch.randn(1000, generator=gen)), 1000)
               for _ in range(5)]
    result = (sum(decoded) / 5).to(torch.float16).float()
    results = codec.for_results(5)
    assert results == TopKCodec(64, 20) and codec.for_results(100) == TopKCodec(64, 64)
    assert torch.equal(results.decode(results.encode(result), 1000), result)
    assert results.error_norm(result) <= 2.0**-11 * float(result.norm()) * 1.01
    assert Float16Codec().for_results(5) == Float16Codec()


def test_bad_topk_positions_are_rejected():
    codec = TopKCodec(block_size=8, k=2)
    payload = bytearray(codec.encode(torch.arange(16, dtype=torch.float32)))
    positions = struct.unpack("<4H", payload[:8])
    assert positions == (6, 7, 6, 7)     # the two largest of each block, ascending
    for bad in ((7, 6, 6, 7), (6, 6, 6, 7), (6, 8, 6, 7), (6, 7, 6, 65535)):
        forged = struct.pack("<4H", *bad) + payload[8:]
        with pytest.raises(RemoteProtocolError, match="positions"):
            codec.decode(forged, 16)


@settings(max_examples=150, deadline=None)
@given(tensors(st.one_of(MODERATE, st.floats(-2.0**-20, 2.0**-20, width=32))),
       st.sampled_from([QTopKCodec(), QTopKCodec(block_size=7, k=3),
                        QTopKCodec(block_size=16, k=16, bits=4),
                        QTopKCodec(block_size=300, k=5, bits=8)]))
def test_qtopk_keeps_topks_values_on_a_grid_of_their_block(t, codec):
    """qtopk keeps what topk keeps; each kept value decodes to one of the
    2**bits points of its block's grid, within the documented bound: half a
    step of the grid over the block's kept values."""
    flat = t.reshape(-1)
    y = roundtrip(codec, t).reshape(-1)
    kept = codec.kept_mask(flat)
    assert torch.equal(kept, TopKCodec(codec.block_size, codec.k).kept_mask(flat))
    assert bool((y[~kept] == 0).all())
    err = (y.double() - flat.double()).abs()
    assert bool((err <= codec.error_bound(flat)).all())
    clamped = flat.double().clamp(-FP16_MAX, FP16_MAX)
    for lo in range(0, flat.numel(), codec.block_size):
        mask = kept[lo:lo + codec.block_size]
        values = y[lo:lo + codec.block_size][mask]
        assert values.unique().numel() <= 2**codec.bits
        x = clamped[lo:lo + codec.block_size][mask]
        if x.numel() and float(flat[lo:lo + codec.block_size][mask].abs().max()) <= FP16_MAX:
            # the bound is half the kept range's step, give or take fp16's rounding
            # of the grid (its minimum down, its step up); blocks with a clamped
            # value are left to the bound above
            half = (float(x.max()) - float(x.min())) / codec.levels / 2
            bound = codec.error_bound(flat)[lo:lo + codec.block_size][mask]
            assert float(bound.max()) <= half * (1 + 2.0**-9) + 2.0**-10 * float(
                x.abs().max()) + 2.0**-24


def test_qtopk_layout_and_size():
    """Grid minima and steps (fp16), positions (one byte for blocks of at
    most 256, else two), then the codes, first entry in the low bits."""
    codec = QTopKCodec(block_size=8, k=2, bits=2)
    t = torch.tensor([0, 0, 0, 0, 0, 0, 1.0, 4.0, -2.0, 0, 0, 0, 0, 0, 0, 3.0])
    payload = bytes(codec.encode(t))
    low = struct.unpack("<2e", payload[:4])
    step = struct.unpack("<2e", payload[4:8])
    assert low == (1.0, -2.0) and step == (1.0, 5.0 / 3.0 if 5.0 / 3 == float(
        torch.tensor(5.0 / 3).half()) else step[1])
    assert tuple(payload[8:12]) == (6, 7, 0, 7)
    assert payload[12] == 0 | 3 << 2 | 0 << 4 | 3 << 6
    assert len(payload) == 13 == codec.encoded_size(16)
    assert torch.equal(codec.decode(payload, 16)[[6, 7, 8, 15]],
                       torch.tensor([1.0, 4.0, -2.0, -2.0 + 3 * float(step[1])]))
    default = QTopKCodec()
    assert (default.block_size, default.k, default.bits) == (256, 8, 2)
    # 39,063 blocks (the last of 128 values): 4 bytes of grid, 8 positions, 16 bits of codes
    assert default.encoded_size(10_000_000) == 4 * 39063 + 312504 + 312504 // 4
    assert QTopKCodec(300, 5, 4).encoded_size(600) == 4 * 2 + 2 * 10 + 5
    assert QTopKCodec(256, 8, 16).encoded_size(512) == 3 * 16
    for bad in (dict(bits=3), dict(bits=32), dict(bits=2.0), dict(bits=True), dict(k=0)):
        with pytest.raises(ConfigError):
            QTopKCodec(**bad)


def test_qtopk_results_carry_the_union_in_fp16():
    """As topk's: k times the members per block, here with fp16 values (and
    one-byte positions), so that verification's slack stays fp16's."""
    codec = QTopKCodec(block_size=64, k=4)
    assert codec.for_results(5) == QTopKCodec(64, 20, 16)
    assert codec.for_results(100) == QTopKCodec(64, 64, 16)
    gen = torch.Generator().manual_seed(5)
    decoded = [codec.decode(codec.encode(torch.randn(1000, generator=gen)), 1000)
               for _ in range(5)]
    result = (sum(decoded) / 5).to(torch.float16).float()
    results = codec.for_results(5)
    assert torch.equal(results.decode(results.encode(result), 1000), result)
    assert results.error_norm(result) <= 2.0**-11 * float(result.norm()) * 1.01
    assert results.encoded_size(1000) == 3 * (15 * 20 + 20) < TopKCodec(64, 20).encoded_size(
        1000)


def test_bad_qtopk_payloads_are_rejected():
    codec = QTopKCodec(block_size=8, k=2)
    good = bytearray(codec.encode(torch.arange(16, dtype=torch.float32)))
    cases = {
        "grid": [(0, struct.pack("<e", math.nan)), (2, struct.pack("<e", math.inf)),
                 (4, struct.pack("<e", -1.0)), (6, struct.pack("<e", math.nan))],
        "positions": [(8, bytes([7, 6])), (10, bytes([6, 6])), (10, bytes([6, 8]))],
    }
    for message, edits in cases.items():
        for offset, data in edits:
            forged = bytearray(good)
            forged[offset:offset + len(data)] = data
            with pytest.raises(RemoteProtocolError, match=message):
                codec.decode(bytes(forged), 16)
    fp16 = QTopKCodec(block_size=8, k=2, bits=16)
    payload = bytearray(fp16.encode(torch.arange(16, dtype=torch.float32)))
    payload[2:4] = struct.pack("<e", math.inf)
    with pytest.raises(RemoteProtocolError, match="NaN or infinite"):
        fp16.decode(bytes(payload), 16)
    # three entries of two bits: the last byte's top two bits are unused
    odd = QTopKCodec(block_size=8, k=3)
    payload = bytearray(odd.encode(torch.arange(8, dtype=torch.float32)))
    payload[-1] |= 0b11000000
    with pytest.raises(RemoteProtocolError, match="after its last entry"):
        odd.decode(bytes(payload), 8)


# -- choosing codecs, and their names on the wire ----------------------------


def test_the_codecs_by_name():
    assert set(CODECS) == {"none", "fp16", "uint8", "uint4", "topk", "qtopk"}
    assert get_codec("topk") == TopKCodec(DEFAULT_TOPK_BLOCK_SIZE, DEFAULT_TOPK_K)
    for bad in (dict(block_size=0), dict(block_size=2**16 + 1), dict(k=0),
                dict(block_size=8, k=9), dict(k=1.5), dict(k=True)):
        with pytest.raises(ConfigError):
            TopKCodec(**bad)
    assert TopKCodec().encoded_size(10_000_000) == 4 * (39062 * 8 + 8)
    assert all(codec.name == name for name, codec in CODECS.items())
    assert get_codec("uint8") == Uint8Codec(DEFAULT_BLOCK_SIZE)
    assert get_codec("uint8", 64) == Uint8Codec(64)
    assert get_codec("uint4") == Uint4Codec(DEFAULT_UINT4_BLOCK_SIZE)
    assert get_codec("uint4", 64) == Uint4Codec(64)
    with pytest.raises(ConfigError):
        get_codec("zstd")
    for bad in (0, -1, 2**24 + 1, 1.5, True):
        with pytest.raises(ConfigError):
            Uint8Codec(bad)
    assert Uint8Codec().encoded_size(10_000_000) == 10_000_000 + 8 * 2442


def test_choose_codec_by_size():
    policy = CodecPolicy()
    assert (policy.small, policy.large, policy.threshold) == ("none", "fp16", 2**16)
    assert choose_codec(0).name == "none"
    assert choose_codec(2**16 - 1).name == "none"
    assert choose_codec(2**16).name == "fp16"
    custom = CodecPolicy(small="fp16", large="uint8", threshold=1000, block_size=256)
    assert choose_codec(999, custom) == Float16Codec()
    assert choose_codec(1000, custom) == Uint8Codec(256)
    assert choose_codec(1000, CodecPolicy(large="uint4", threshold=1000)) == Uint4Codec(256)
    assert choose_codec(1000, CodecPolicy(large="uint8", threshold=1000)) == Uint8Codec(4096)
    for bad in (dict(small="gzip"), dict(large="uint9"), dict(threshold=-1),
                dict(block_size=0)):
        with pytest.raises(ConfigError):
            CodecPolicy(**bad)


def test_codec_from_header_checks_what_the_peer_announced():
    for codec in ALL:
        assert codec_from_header(codec.name, codec.meta()) == codec
    for name, meta in [("gzip", None), ("none", {"block_size": 4}), ("uint8", None),
                       ("uint8", {}), ("uint8", {"block_size": 0}),
                       ("uint8", {"block_size": "4096"}), ("uint8", {"block_size": 2**30}),
                       ("uint8", {"block_size": 64, "extra": 1}), ("uint4", None),
                       ("uint4", {"block_size": 0}), ("uint4", [64]), ("topk", None),
                       ("topk", {"block_size": 256}), ("topk", {"block_size": 8, "k": 9}),
                       ("topk", {"block_size": 2**17, "k": 8}),
                       ("topk", {"block_size": 256, "k": 8, "extra": 1}),
                       ("topk", {"block_size": 256, "k": 8, "bits": 2}),
                       ("qtopk", {"block_size": 256, "k": 8}),
                       ("qtopk", {"block_size": 256, "k": 8, "bits": 3}),
                       ("qtopk", {"block_size": 256, "k": 8, "bits": 2.0}),
                       ("qtopk", {"block_size": 256, "k": 8, "bits": 32}),
                       ("qtopk", {"block_size": 256, "k": 8, "bits": True}),
                       ("qtopk", {"block_size": 4, "k": 8, "bits": 2})]:
        with pytest.raises(RemoteProtocolError):
            codec_from_header(name, meta)


@pytest.mark.parametrize("codec", ALL, ids=lambda c: f"{c.name}{getattr(c, 'block_size', '')}")
def test_a_chunk_travels_in_a_tensor_frame(codec):
    t = torch.randn(3, 33)
    data = codec.encode(t)
    header = TensorHeader(part=1, dtype="float32", shape=(3, 33), offset=0, count=99,
                          codec=codec.name, meta=codec.meta())
    frame = bytearray(encode_tensor_frame(header, len(data)) + bytes(data))
    chunk = decode_tensor_frame(frame[FRAME_HEADER_SIZE:])
    received = codec_from_header(chunk.header.codec, chunk.header.meta)
    assert torch.equal(received.decode(chunk.data, chunk.header.count), roundtrip(codec, t))
