"""NAT layer: reachability by dial-back, and client mode.

Sits above the wire (it is a request/response protocol) and drives the
host's relay reservations: a node that is not known to be public keeps
reservations on relays.  Relays, relayed dialling and hole punching
themselves are host features (``p2pdl.net``).  Modules:

* ``config`` -- :class:`NatConfig`, documented defaults.
* ``_messages`` -- the dial-back protocol ``/p2pdl/dialback/1.0.0``.
* ``_state`` -- :class:`ReachabilityTracker` (sans-IO).
* ``_service`` -- :class:`NatService`: probing, answering, client mode.
"""

from ._messages import DIALBACK as DIALBACK
from ._messages import DIALBACK_PROTOCOL_ID as DIALBACK_PROTOCOL_ID
from ._messages import DialBackRequest as DialBackRequest
from ._messages import DialBackResponse as DialBackResponse
from ._messages import DialBackResult as DialBackResult
from ._service import NatService as NatService
from ._service import NatStatistics as NatStatistics
from ._state import Reachability as Reachability
from ._state import ReachabilityTracker as ReachabilityTracker
from .config import NatConfig as NatConfig
