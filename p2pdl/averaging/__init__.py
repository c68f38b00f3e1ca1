"""Averaging layer: peers that are ready for a step form groups and average.

Issue 5 builds **matchmaking**: peers ready for the same epoch of a run form
groups of at most ``target_group_size`` within ``matchmaking_time``, with no
coordinator, through the DHT and one request/response protocol
(protocols/matchmaking.md, docs/matchmaking.md).  Reach it as
``node.matchmaking``.  Issue 6 adds the all-reduce.  Modules:

* ``config`` -- :class:`MatchmakingConfig` (documented defaults) and the
  wire's hard limits.
* ``_mm_messages`` -- the protocol ``/p2pdl/matchmaking/1.0.0``: join,
  formed, rejected.
* ``_matchmaking`` -- sans-IO: the order of peers, the plan of a view,
  :class:`LeaderState`, :class:`MatchmakingRound`, group ids and the checks
  of a leader's answer.
* ``_mm_service`` -- :class:`MatchmakingService`: announce, gather, lead or
  join, retry.
"""

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
from .config import MatchmakingConfig as MatchmakingConfig
