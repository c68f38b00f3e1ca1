"""Averaging layer: peers that are ready for a step form groups and average.

Issue 5 builds **matchmaking**: peers ready for the same epoch of a run form
groups of at most ``target_group_size`` within ``matchmaking_time``, with no
coordinator, through the DHT and one request/response protocol
(protocols/matchmaking.md, docs/matchmaking.md).  Reach it as
``node.matchmaking``.  Then the group averages with a butterfly all-reduce
(protocols/allreduce.md, docs/allreduce.md): ``node.averaging.all_reduce``.  Modules:

* ``config`` -- :class:`MatchmakingConfig` (documented defaults) and the
  wire's hard limits.
* ``_mm_messages`` -- the protocol ``/p2pdl/matchmaking/1.0.0``: join,
  formed, rejected.
* ``_matchmaking`` -- sans-IO: the order of peers, the plan of a view,
  :class:`LeaderState`, :class:`MatchmakingRound`, group ids and the checks
  of a leader's answer.
* ``_mm_service`` -- :class:`MatchmakingService`: announce, gather, lead or
  join, retry.
* ``_balancing`` -- sans-IO: the linear program that sizes each reducer's part
  from bandwidth and compute (:func:`plan_load`), equal shares, part sizes.
* ``_codecs`` -- sans-IO: how tensors travel -- codecs ``none``, ``fp16`` and
  blockwise ``uint8``, their error bounds, strict decoding, and
  :func:`choose_codec` by size (:class:`CodecPolicy`).
* ``_allreduce`` -- sans-IO: the :class:`Layout` of parts and chunks every
  member computes, :class:`PartReducer` (weighted sums, exclusions, averages
  chunk by chunk), :class:`PartReceiver`, the results.
* ``_ar_messages`` -- the protocol ``/p2pdl/allreduce/1.0.0``: begin, done,
  reject, and the chunks as TENSOR frames.
* ``_ar_service`` -- :class:`AllReduceService` (``node.averaging``): the
  streams of a butterfly all-reduce, sending, reducing and receiving at once.
"""

from ._allreduce import AllReduceResult as AllReduceResult
from ._allreduce import Contribution as Contribution
from ._allreduce import Layout as Layout
from ._allreduce import PartReceiver as PartReceiver
from ._allreduce import PartReducer as PartReducer
from ._allreduce import PartResult as PartResult
from ._ar_messages import ALLREDUCE_PROTOCOL_ID as ALLREDUCE_PROTOCOL_ID
from ._ar_service import AllReduceService as AllReduceService
from ._balancing import LoadPlan as LoadPlan
from ._balancing import PeerCapacity as PeerCapacity
from ._balancing import equal_shares as equal_shares
from ._balancing import part_sizes as part_sizes
from ._balancing import plan_load as plan_load
from ._codecs import CODECS as CODECS
from ._codecs import Codec as Codec
from ._codecs import CodecPolicy as CodecPolicy
from ._codecs import Float16Codec as Float16Codec
from ._codecs import NoneCodec as NoneCodec
from ._codecs import Uint8Codec as Uint8Codec
from ._codecs import choose_codec as choose_codec
from ._codecs import codec_from_header as codec_from_header
from ._codecs import get_codec as get_codec
from ._matchmaking import GROUP_ID_DOMAIN as GROUP_ID_DOMAIN
from ._matchmaking import ORDER_DOMAIN as ORDER_DOMAIN
from ._matchmaking import Group as Group
from ._matchmaking import GroupMemberInfo as GroupMemberInfo
from ._matchmaking import LeaderState as LeaderState
from ._matchmaking import MatchmakingRound as MatchmakingRound
from ._matchmaking import Plan as Plan
from ._matchmaking import PlannedGroup as PlannedGroup
from ._matchmaking import compute_group_id as compute_group_id
from ._matchmaking import next_leader as next_leader
from ._matchmaking import order_key as order_key
from ._matchmaking import plan_groups as plan_groups
from ._mm_messages import MATCHMAKING_PROTOCOL as MATCHMAKING_PROTOCOL
from ._mm_messages import MATCHMAKING_PROTOCOL_ID as MATCHMAKING_PROTOCOL_ID
from ._mm_service import MatchmakingService as MatchmakingService
from ._mm_service import round_key as round_key
from .config import AllReduceConfig as AllReduceConfig
from .config import MatchmakingConfig as MatchmakingConfig
