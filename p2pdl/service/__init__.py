"""The service contract: what every protocol service of a node is and gets.

Sits above the wire and below every protocol package (nat, dht, progress,
statesync, averaging).  Modules:

* ``_contract`` -- :class:`ServiceContext` (host, RPC call, wire limits), the
  :class:`Service` protocol (constructor shape, ``endpoints``, ``serve(*,
  task_status)``, ``statistics``), the frozen :class:`Statistics` record base,
  and the shared types ``Call``, :class:`Reachability`, :class:`ReachabilityView`.
* ``_endpoints`` -- :class:`RpcEndpoint`, :class:`StreamEndpoint` and
  :func:`install_endpoint`, which serves them behind the admission gate.
* ``_admission`` -- the admission gate (:class:`AdmissionGate`,
  :class:`OpenAdmission`, :class:`Refusal`), what services read of a run's
  membership (:class:`MembershipView`, :class:`Role`) and the node's :class:`Gatekeeper`.
* ``_flags`` -- the node's :class:`FlagBook` of peers caught lying about
  themselves (a report far ahead of the quorum, a weight beyond evidence).
* ``_gates`` -- how the node composes its gate: a user's gate and the run
  memberships (:class:`BothGates`), then the flag book's bans (:class:`BanningGate`).
* ``_validate`` -- run ids (one meaning everywhere: at most 128 bytes of
  UTF-8) and number checks shared by every configuration.
"""

from ._admission import MAX_LOGGED_PEERS as MAX_LOGGED_PEERS
from ._admission import NOT_ADMITTED as NOT_ADMITTED
from ._admission import AdmissionGate as AdmissionGate
from ._admission import AdmissionStatistics as AdmissionStatistics
from ._admission import Gatekeeper as Gatekeeper
from ._admission import MembershipView as MembershipView
from ._admission import OpenAdmission as OpenAdmission
from ._admission import Refusal as Refusal
from ._admission import Role as Role
from ._contract import Call as Call
from ._contract import Reachability as Reachability
from ._contract import ReachabilityView as ReachabilityView
from ._contract import Service as Service
from ._contract import ServiceContext as ServiceContext
from ._contract import Statistics as Statistics
from ._contract import serve_nothing as serve_nothing
from ._endpoints import Endpoint as Endpoint
from ._endpoints import Opened as Opened
from ._endpoints import RpcEndpoint as RpcEndpoint
from ._endpoints import StreamEndpoint as StreamEndpoint
from ._endpoints import gated_handler as gated_handler
from ._endpoints import install_endpoint as install_endpoint
from ._endpoints import no_run as no_run
from ._endpoints import run_of_request as run_of_request
from ._flags import MAX_FLAGGED_PEERS as MAX_FLAGGED_PEERS
from ._flags import Flag as Flag
from ._flags import FlagBook as FlagBook
from ._gates import BanningGate as BanningGate
from ._gates import BothGates as BothGates
from ._validate import MAX_RUN_ID_BYTES as MAX_RUN_ID_BYTES
from ._validate import RunId as RunId
from ._validate import check_run_id as check_run_id
from ._validate import is_int as is_int
from ._validate import is_number as is_number
from ._validate import is_positive as is_positive
from ._validate import run_id_problem as run_id_problem
