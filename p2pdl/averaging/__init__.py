"""Averaging layer: peers that are ready for a step form groups and average.

Two protocols, each a package of the same shape, and the pieces they share:

* ``matchmaking`` -- ``/p2pdl/matchmaking/1.0.0`` (``node.matchmaking``): peers
  ready for the same epoch of a run form groups of at most
  ``target_group_size`` within ``matchmaking_time``, with no coordinator.
* ``allreduce`` -- ``/p2pdl/allreduce/1.0.0`` (``node.allreduce``): the group's
  butterfly all-reduce.
* ``_aggregators`` -- sans-IO: how a reducer combines the copies of a chunk
  (:class:`Aggregator`: the weighted mean, CenteredClip, trimmed mean,
  median).
* ``_balancing`` -- sans-IO: the linear program that sizes each reducer's part
  from bandwidth and compute (:func:`plan_load`), equal shares, part sizes;
  used by the matchmaking leader (the plan) and the all-reduce (its layout).
* ``_capacity`` -- sans-IO: a node's own rates, measured from its rounds
  (:class:`CapacityEstimator`), what it declares to the load plan.
* ``_codecs`` -- sans-IO: how tensors travel -- codecs ``none``, ``fp16`` and
  blockwise ``uint8`` and ``uint4``, their error bounds, strict decoding, and
  :func:`choose_codec` by size (:class:`CodecPolicy`).
* ``_norms`` -- sans-IO: Euclidean norms of large float32 tensors summed in
  float64 block by block (no float64 copy of the whole), for the codecs'
  error bounds and the all-reduce's verification.
* ``_round`` -- :func:`average_round`: form a group, then average with it.
* ``config`` -- both protocols' settings under one import path.

Every public name of the two protocol packages is re-exported here.
"""

from ._aggregators import AGGREGATORS as AGGREGATORS
from ._aggregators import Aggregator as Aggregator
from ._balancing import LoadPlan as LoadPlan
from ._balancing import PeerCapacity as PeerCapacity
from ._balancing import equal_shares as equal_shares
from ._balancing import part_sizes as part_sizes
from ._balancing import plan_load as plan_load
from ._balancing import round_time as round_time
from ._capacity import CapacityEstimate as CapacityEstimate
from ._capacity import CapacityEstimator as CapacityEstimator
from ._codecs import CODECS as CODECS
from ._codecs import Codec as Codec
from ._codecs import CodecPolicy as CodecPolicy
from ._codecs import Float16Codec as Float16Codec
from ._codecs import NoneCodec as NoneCodec
from ._codecs import QTopKCodec as QTopKCodec
from ._codecs import TopKCodec as TopKCodec
from ._codecs import Uint4Codec as Uint4Codec
from ._codecs import Uint8Codec as Uint8Codec
from ._codecs import choose_codec as choose_codec
from ._codecs import codec_from_header as codec_from_header
from ._codecs import get_codec as get_codec
from ._round import average_round as average_round
from .allreduce import ALLREDUCE_PROTOCOL_ID as ALLREDUCE_PROTOCOL_ID
from .allreduce import OUTLIER_FLAG as OUTLIER_FLAG
from .allreduce import WEIGHT_FLAG as WEIGHT_FLAG
from .allreduce import AllReduceConfig as AllReduceConfig
from .allreduce import AllReduceResult as AllReduceResult
from .allreduce import AllReduceService as AllReduceService
from .allreduce import AllReduceStatistics as AllReduceStatistics
from .allreduce import Contribution as Contribution
from .allreduce import Layout as Layout
from .allreduce import PartReceiver as PartReceiver
from .allreduce import PartReducer as PartReducer
from .allreduce import PartResult as PartResult
from .allreduce import WeightEvidence as WeightEvidence
from .allreduce import cap_shares as cap_shares
from .allreduce import cap_to_median as cap_to_median
from .matchmaking import GROUP_ID_DOMAIN as GROUP_ID_DOMAIN
from .matchmaking import MATCHMAKING_PROTOCOL as MATCHMAKING_PROTOCOL
from .matchmaking import MATCHMAKING_PROTOCOL_ID as MATCHMAKING_PROTOCOL_ID
from .matchmaking import ORDER_DOMAIN as ORDER_DOMAIN
from .matchmaking import Group as Group
from .matchmaking import GroupMemberInfo as GroupMemberInfo
from .matchmaking import LeaderState as LeaderState
from .matchmaking import MatchmakingConfig as MatchmakingConfig
from .matchmaking import MatchmakingRound as MatchmakingRound
from .matchmaking import MatchmakingService as MatchmakingService
from .matchmaking import MatchmakingStatistics as MatchmakingStatistics
from .matchmaking import Plan as Plan
from .matchmaking import PlannedGroup as PlannedGroup
from .matchmaking import compute_group_id as compute_group_id
from .matchmaking import next_leader as next_leader
from .matchmaking import order_key as order_key
from .matchmaking import plan_fractions as plan_fractions
from .matchmaking import plan_groups as plan_groups
from .matchmaking import round_key as round_key
