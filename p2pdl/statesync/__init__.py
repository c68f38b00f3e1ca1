"""State sync (``/p2pdl/statesync/1.0.0``, ``node.statesync``): a peer that joins late
or falls behind downloads the training state from donors, chunk by chunk, each
chunk verified (protocols/statesync.md, docs/statesync.md).

Modules:

* ``config`` -- :class:`StateSyncConfig` (documented defaults) and the wire's
  hard limits.
* ``_messages`` -- the protocol: manifest and chunk requests, replies, refusals.
* ``_state`` -- sans-IO: manifests, the donors' vote on a state
  (:func:`vote_on_state` -> :class:`StateVote`), the exclusions of donors
  caught lying.
* ``_snapshots`` -- sans-IO: the snapshot table of a donor.
* ``_downloads`` -- sans-IO: resumable partial downloads and the chunk plan.
* ``_service`` -- :class:`StateSyncService`, the service: its two sides,
  its statistics, its endpoint.
* ``_donor`` -- the donor side: share snapshots, answer fetchers (``busy``
  while ``max_concurrent_uploads`` replies wait to be written).
* ``_fetcher`` -- the fetcher side: offers, the vote, the download of
  verified chunks -> :class:`StateDownload`.
"""

from ._fetcher import StateDownload as StateDownload
from ._messages import STATESYNC_PROTOCOL as STATESYNC_PROTOCOL
from ._messages import STATESYNC_PROTOCOL_ID as STATESYNC_PROTOCOL_ID
from ._service import StateSyncService as StateSyncService
from ._service import StateSyncStatistics as StateSyncStatistics
from ._state import Manifest as Manifest
from ._state import StateVote as StateVote
from ._state import vote_on_state as vote_on_state
from .config import StateSyncConfig as StateSyncConfig
