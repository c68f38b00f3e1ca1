"""Matchmaking (``/p2pdl/matchmaking/1.0.0``, ``node.matchmaking``): peers ready for
the same epoch of a run form averaging groups, with no coordinator, through the
DHT and one request/response protocol (protocols/matchmaking.md, docs/matchmaking.md).

Modules:

* ``config`` -- :class:`MatchmakingConfig` (documented defaults) and the wire's
  hard limits, shared with the all-reduce (group size, group id size, epoch).
* ``_messages`` -- the protocol: join, formed, rejected.
* ``_plan`` -- sans-IO: the order of peers, the plan of a view, whom to
  join, group ids, load plans and the checks of what peers say.
* ``_state`` -- sans-IO: :class:`LeaderState`, :class:`MatchmakingRound`,
  :class:`LeaderSearch`, :class:`UnresponsivePeers`, the check of a
  leader's answer.
* ``_service`` -- :class:`MatchmakingService`: announce, gather, lead or join,
  retry.
"""

from ._messages import MATCHMAKING_PROTOCOL as MATCHMAKING_PROTOCOL
from ._messages import MATCHMAKING_PROTOCOL_ID as MATCHMAKING_PROTOCOL_ID
from ._plan import GROUP_ID_DOMAIN as GROUP_ID_DOMAIN
from ._plan import ORDER_DOMAIN as ORDER_DOMAIN
from ._plan import Group as Group
from ._plan import GroupMemberInfo as GroupMemberInfo
from ._plan import Plan as Plan
from ._plan import PlannedGroup as PlannedGroup
from ._plan import compute_group_id as compute_group_id
from ._plan import next_leader as next_leader
from ._plan import order_key as order_key
from ._plan import plan_fractions as plan_fractions
from ._plan import plan_groups as plan_groups
from ._service import MatchmakingService as MatchmakingService
from ._service import MatchmakingStatistics as MatchmakingStatistics
from ._service import round_key as round_key
from ._state import LeaderState as LeaderState
from ._state import MatchmakingRound as MatchmakingRound
from .config import MatchmakingConfig as MatchmakingConfig
