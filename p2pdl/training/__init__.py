"""Training layer: the PyTorch adapter over the layers below (docs/training.md).

Modules:

* ``_optimizer`` -- :class:`Optimizer` and :class:`OptimizerConfig`: a torch
  optimizer that trains with the swarm (DeDLOC gradient averaging, delayed
  updates, DiLoCo outer steps, catch-up by state sync, consistency checks,
  checkpoints, LR schedulers).
* ``_example`` -- the built-in example task: a small transformer language
  model on the documentation text that ships with CPython (no downloads).
* ``_checkpoint`` -- atomic checkpoints (temp file, fsync, rename) and resuming.
* ``config``, ``_statesync``, ``_ss_messages``, ``_ss_service`` -- state sync
  (``/p2pdl/statesync/1.0.0``, ``node.state_sync``): :class:`StateSyncConfig`;
  sans-IO manifests, snapshots, resumable downloads and the chunk plan; the
  messages; :class:`StateSyncService` (share, serve, fetch ->
  :class:`StateDownload`) -- protocols/statesync.md, docs/statesync.md.
"""

from ._example import ExampleConfig as ExampleConfig
from ._example import ExampleTask as ExampleTask
from ._example import TinyTransformerLM as TinyTransformerLM
from ._optimizer import Optimizer as Optimizer
from ._optimizer import OptimizerConfig as OptimizerConfig
from ._optimizer import RoundInfo as RoundInfo
from ._ss_messages import STATESYNC_PROTOCOL_ID as STATESYNC_PROTOCOL_ID
from ._ss_service import StateDownload as StateDownload
from ._ss_service import StateSyncService as StateSyncService
from .config import StateSyncConfig as StateSyncConfig
