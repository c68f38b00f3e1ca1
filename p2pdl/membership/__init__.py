"""Membership layer: who may touch a run (protocols/membership.md, docs/security.md).

A node guards each run by a policy: :class:`OpenRun` (anyone; also every run
without a policy), :class:`AllowlistRun` (listed peer ids) or
:class:`CertificateRun` (certificates signed by the run's
:class:`Authority`, with roles, expiry and revocation).  The node's admission
gate is the :class:`MembershipService`: every run-scoped request and stream
(progress, matchmaking, all-reduce, state sync, the run's DHT keys) is
admitted only for members, checked on the connection's authenticated peer id.
Certificates are shown once per connection by the handshake
``/p2pdl/membership/1.0.0``.  Reach it as ``node.membership``.  Modules:

* ``config`` -- :class:`MembershipConfig` (documented defaults) and the hard limits.
* ``_certificates`` -- :class:`Certificate`, :class:`RevocationList`,
  :class:`Authority`: signing, strict decoding, files (sans-IO).
* ``_messages`` -- the protocol ``/p2pdl/membership/1.0.0``: hello, welcome,
  revocation fetches.
* ``_state`` -- the run policies and :class:`MembershipTable`, the gate's
  sans-IO core.
* ``_service`` -- :class:`MembershipService`: the gate, introductions, the
  handshake's server side, revocation refresh from the DHT.
"""

from ..service import Role as Role
from ._certificates import CERTIFICATE_DOMAIN as CERTIFICATE_DOMAIN
from ._certificates import REVOCATION_DOMAIN as REVOCATION_DOMAIN
from ._certificates import Authority as Authority
from ._certificates import Certificate as Certificate
from ._certificates import RevocationList as RevocationList
from ._certificates import peer_id_problem as peer_id_problem
from ._messages import MEMBERSHIP_PROTOCOL as MEMBERSHIP_PROTOCOL
from ._messages import MEMBERSHIP_PROTOCOL_ID as MEMBERSHIP_PROTOCOL_ID
from ._service import MembershipService as MembershipService
from ._service import MembershipStatistics as MembershipStatistics
from ._service import revocation_key as revocation_key
from ._state import AllowlistRun as AllowlistRun
from ._state import CertificateRun as CertificateRun
from ._state import Member as Member
from ._state import MembershipTable as MembershipTable
from ._state import OpenRun as OpenRun
from ._state import RunPolicy as RunPolicy
from .config import REVOCATION_PREFIX as REVOCATION_PREFIX
from .config import MembershipConfig as MembershipConfig
