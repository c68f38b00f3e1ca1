"""Tensor frames: a small typed header plus raw bytes.  No I/O.

A TENSOR frame's payload is ``header length (u16, big-endian) | header | data``.
The header is a message envelope whose body is :class:`TensorHeader`; the
data is ``count`` elements of ``dtype`` (for codec ``none``) or a codec's
encoding of them.  Senders write the data straight from the tensor's memory;
receivers get it in a buffer of its own that a tensor can wrap without a copy.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

from ..errors import LocalProtocolError, RemoteProtocolError
from ._frames import FrameKind, frame_header
from ._messages import MaxLen, Message, MessageSet, Range, encode_message

if TYPE_CHECKING:
    import torch

__all__ = ["TensorHeader", "TensorChunk", "DTYPE_SIZES", "encode_tensor_frame",
           "decode_tensor_frame", "iter_tensor_chunks"]

_HEADER_LEN = struct.Struct(">H")
MAX_TENSOR_HEADER = 64 * 1024 - 1

#: Element sizes of the dtypes the wire carries, by their torch names.
DTYPE_SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
MAX_DIMS = 32
MAX_NUMEL = 2**48


class TensorHeader(Message, tag="tensor"):
    """Describes one chunk of a tensor.

    Attributes:
        part: application-defined id of the tensor (or tensor part) this chunk
            belongs to, unique within the stream's exchange.
        dtype: element type, one of :data:`DTYPE_SIZES`.
        shape: shape of the whole tensor.
        offset: index of the chunk's first element in the flattened tensor.
        count: number of elements in this chunk.
        codec: how the data is encoded; ``none`` means raw little-endian
            elements.  Other codecs are defined by the protocols that use them.
        meta: codec parameters (small), or None.
    """

    part: Annotated[int, Range(0, 2**32 - 1)]
    dtype: str
    shape: Annotated[tuple[Annotated[int, Range(0, MAX_NUMEL)], ...], MaxLen(MAX_DIMS)]
    offset: Annotated[int, Range(0, MAX_NUMEL)]
    count: Annotated[int, Range(0, MAX_NUMEL)]
    codec: Annotated[str, MaxLen(32)] = "none"
    meta: dict[str, int | float | str | bytes] | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_SIZES:
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        numel = math.prod(self.shape)
        if numel > MAX_NUMEL:
            raise ValueError(f"tensor of {numel} elements is too large")
        if self.offset + self.count > numel:
            raise ValueError(
                f"chunk [{self.offset}, {self.offset + self.count}) exceeds {numel} elements"
            )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]


_HEADER_SET = MessageSet(TensorHeader)


class TensorChunk(NamedTuple):
    """A received tensor chunk.  ``data`` is a view into a buffer this chunk owns."""

    request_id: int
    header: TensorHeader
    data: memoryview

    def to_tensor(self) -> torch.Tensor:
        """The chunk's elements as a 1-D tensor sharing the received buffer (codec none)."""
        import torch

        if self.header.codec != "none":
            raise LocalProtocolError(f"chunk uses codec {self.header.codec!r}; decode it first")
        dtype = getattr(torch, self.header.dtype)
        if self.header.count == 0:
            return torch.empty(0, dtype=dtype)
        return torch.frombuffer(self.data, dtype=dtype, count=self.header.count)


def encode_tensor_frame(header: TensorHeader, nbytes: int, request_id: int = 0) -> bytes:
    """Frame header, payload prefix and tensor header for a chunk of ``nbytes`` of data.

    The caller writes the returned bytes followed by the data itself, so the
    data is never copied into a frame buffer.
    """
    encoded = encode_message(header, request_id)
    if len(encoded) > MAX_TENSOR_HEADER:
        raise LocalProtocolError("tensor header too large")
    payload_length = _HEADER_LEN.size + len(encoded) + nbytes
    return frame_header(FrameKind.TENSOR, payload_length) + _HEADER_LEN.pack(len(encoded)) + encoded


def decode_tensor_frame(payload: bytearray) -> TensorChunk:
    """Parse a TENSOR frame payload.  Raises :class:`RemoteProtocolError` if malformed."""
    if len(payload) < _HEADER_LEN.size:
        raise RemoteProtocolError("TENSOR frame too short for its header length")
    (header_len,) = _HEADER_LEN.unpack_from(payload)
    start = _HEADER_LEN.size + header_len
    if start > len(payload):
        raise RemoteProtocolError("TENSOR frame header runs past the frame")
    view = memoryview(payload)
    request_id, header = _HEADER_SET.decode(view[_HEADER_LEN.size:start])
    assert isinstance(header, TensorHeader)
    data = view[start:]
    if header.codec == "none" and len(data) != header.count * header.itemsize:
        raise RemoteProtocolError(
            f"TENSOR frame carries {len(data)} bytes for {header.count} "
            f"{header.dtype} elements"
        )
    return TensorChunk(request_id, header, data)


def tensor_bytes(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], memoryview]:
    """``(dtype name, shape, raw bytes)`` of a CPU tensor, without copying if contiguous."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise LocalProtocolError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in DTYPE_SIZES:
        raise LocalProtocolError(f"dtype {tensor.dtype} cannot be sent")
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return dtype, tuple(tensor.shape), memoryview(b"")
    raw = flat.view(torch.uint8).numpy()
    return dtype, tuple(tensor.shape), memoryview(raw).cast("B")


def iter_tensor_chunks(
    part: int, dtype: str, shape: tuple[int, ...], data: memoryview, chunk_bytes: int,
    codec: str = "none", meta: dict[str, Any] | None = None,
) -> Iterator[tuple[TensorHeader, memoryview]]:
    """Split raw tensor bytes into chunk headers and data views (element-aligned)."""
    itemsize = DTYPE_SIZES[dtype]
    per_chunk = max(1, chunk_bytes // itemsize)
    numel = len(data) // itemsize
    if numel == 0:
        yield TensorHeader(part, dtype, shape, 0, 0, codec, meta), data
        return
    for start in range(0, numel, per_chunk):
        count = min(per_chunk, numel - start)
        yield (TensorHeader(part, dtype, shape, start, count, codec, meta),
               data[start * itemsize : (start + count) * itemsize])
