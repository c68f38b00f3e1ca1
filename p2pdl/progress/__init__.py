"""Progress layer: when has the collaboration processed the global batch?

Each peer publishes a signed report (epoch, samples accumulated, samples per
second, time, client mode; optionally a display name, its recent loss and
how it is reached, for people watching) to the other members of its run by gossip, and
keeps a snapshot of it in the DHT for late joiners and as the fallback when
gossip is partitioned.  From all reports each peer estimates the global
progress by DeDLOC's rules and knows when it is ready to step
(protocols/progress.md, docs/progress.md).  Claims are bounded by evidence:
the epoch follows a quorum of the run's trainers (a peer far ahead of it
moves nobody and is flagged), reports beyond their role's caps are refused,
only members' reports count (a report may carry its peer's membership
credential), and ``ProgressService.reported_samples`` tells what a peer's own
signed reports support.  Reach it as ``node.progress``.  Modules:

* ``config`` -- :class:`ProgressConfig` (documented defaults) and the wire's hard limits.
* ``_messages`` -- the protocol ``/p2pdl/progress/1.0.0``: reports, pushes, signatures.
* ``_state`` -- :class:`ProgressView` (the global view, the quorum epoch, the
  role caps), :class:`PublishPolicy` (dead reckoning), :class:`RateEMA` (sans-IO).
* ``_gossip`` -- :class:`RunGossip`: one run's reports, members, evidence and
  pushes, and the checks of every report received (sans-IO).
* ``_service`` -- :class:`ProgressService` and :class:`ProgressTracker`: signing,
  pushing, anti-entropy and DHT snapshots on trio.
"""

from ._gossip import TrackerStatistics as TrackerStatistics
from ._messages import PATH_KINDS as PATH_KINDS
from ._messages import PROGRESS_PROTOCOL as PROGRESS_PROTOCOL
from ._messages import PROGRESS_PROTOCOL_ID as PROGRESS_PROTOCOL_ID
from ._messages import ROUND_OUTCOMES as ROUND_OUTCOMES
from ._messages import Report as Report
from ._messages import ReportInfo as ReportInfo
from ._messages import SnapshotEntry as SnapshotEntry
from ._messages import round_tag as round_tag
from ._messages import round_tags as round_tags
from ._messages import sign_report as sign_report
from ._messages import verify_report as verify_report
from ._service import SNAPSHOT_SCHEMA as SNAPSHOT_SCHEMA
from ._service import ProgressService as ProgressService
from ._service import ProgressStatistics as ProgressStatistics
from ._service import ProgressTracker as ProgressTracker
from ._state import GlobalProgress as GlobalProgress
from ._state import PeerReport as PeerReport
from ._state import ProgressView as ProgressView
from ._state import PublishPolicy as PublishPolicy
from ._state import RateEMA as RateEMA
from ._state import Verdict as Verdict
from ._state import check_info as check_info
from ._state import check_role_caps as check_role_caps
from ._state import quorum_epoch as quorum_epoch
from .config import SNAPSHOT_PREFIX as SNAPSHOT_PREFIX
from .config import ProgressConfig as ProgressConfig
