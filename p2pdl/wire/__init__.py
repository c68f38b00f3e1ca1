"""Wire layer: framing, typed messages, tensor frames, flow control, RPC.

Every p2pdl protocol speaks this framing (protocols/wire.md).  Modules:

* ``config`` -- :class:`WireConfig` (limits and timeouts, documented defaults)
  and the protocol constants.
* ``_frames`` -- frame encoder/decoder (sans-IO).
* ``_messages`` -- typed messages, the msgpack envelope, strict decoding (sans-IO).
* ``_tensor`` -- tensor frame headers and chunking (sans-IO).
* ``_flow`` -- credit accounting (sans-IO).
* ``_stream`` -- :class:`FramedStream`, the trio service over a libp2p stream.
* ``_protocol`` -- request/response protocol definitions (sans-IO):
  :class:`RpcProtocol`, :class:`RequestContext`, the error codes.
* ``_rpc`` -- request/response on trio: :class:`RpcClient`, the serving loop.
* ``_ping`` -- the ping protocol every node serves.
"""

from ._flow import ReceiveWindow as ReceiveWindow
from ._flow import SendCredit as SendCredit
from ._frames import Frame as Frame
from ._frames import FrameDecoder as FrameDecoder
from ._frames import FrameKind as FrameKind
from ._messages import ErrorReply as ErrorReply
from ._messages import MaxLen as MaxLen
from ._messages import Message as Message
from ._messages import MessageSet as MessageSet
from ._messages import Range as Range
from ._messages import encode_message as encode_message
from ._ping import PING as PING
from ._ping import PING_PROTOCOL_ID as PING_PROTOCOL_ID
from ._ping import PingRequest as PingRequest
from ._ping import PingResponse as PingResponse
from ._ping import answer_ping as answer_ping
from ._protocol import ERROR_CODES as ERROR_CODES
from ._protocol import RequestContext as RequestContext
from ._protocol import RpcHandler as RpcHandler
from ._protocol import RpcProtocol as RpcProtocol
from ._rpc import RpcClient as RpcClient
from ._rpc import serve_rpc_stream as serve_rpc_stream
from ._stream import FramedStream as FramedStream
from ._stream import StreamStatistics as StreamStatistics
from ._stream import open_framed_stream as open_framed_stream
from ._stream import traffic as traffic
from ._tensor import DTYPE_SIZES as DTYPE_SIZES
from ._tensor import TensorChunk as TensorChunk
from ._tensor import TensorHeader as TensorHeader
from .config import INITIAL_CREDIT as INITIAL_CREDIT
from .config import MAX_FRAME_PAYLOAD as MAX_FRAME_PAYLOAD
from .config import MIN_RECEIVE_WINDOW as MIN_RECEIVE_WINDOW
from .config import WireConfig as WireConfig
