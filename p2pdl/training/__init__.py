"""Training layer: the PyTorch adapter over the layers below (docs/training.md).

Modules:

* ``config`` -- :class:`OptimizerConfig` (documented defaults).
* ``_node_api`` -- :class:`TrainingNode`: the typed part of :class:`p2pdl.Node` the optimizer uses.
* ``_optimizer`` -- :class:`Optimizer`, the facade: ``step``, ``zero_grad``, state dicts, ``close``.
* ``_strategies`` -- :class:`DeDLOCStrategy`, :class:`DiLoCoStrategy`: what a round averages, how.
* ``_rounds`` -- :class:`Rounds`: start, wait for, judge rounds; delayed updates; auxiliary help.
* ``_state_keeping`` -- :class:`StateKeeper`: full state, share, fetch, consistency, checkpoints.
* ``_merge`` -- merging states the peers at an epoch agree on no majority for
  (the weighted lower median of every value).
* ``_checkpoint`` -- atomic checkpoints (temp file, fsync, rename) and resuming.
* ``_devices`` -- :class:`HostStaging`: what a round sends from a device (GPU)
  staged in reused host buffers; results brought back next to their tensors.
* ``_task`` -- the protocol of a training task (``p2pdl train --task``) and
  :class:`TaskRunner`, which calls one and names its errors.
* ``_example`` -- the built-in example task: a small transformer language
  model on the documentation text that ships with CPython (no downloads).
* ``_attacks`` -- members that misbehave on purpose (``ATTACKS``: each kind
  of ``p2pdl train --attack`` and ``p2pdl demo --attacker``); imported when
  first used.

State sync, which the Optimizer uses to catch up, is the package
``p2pdl.statesync``.
"""

from ._checkpoint import latest_checkpoint as latest_checkpoint
from ._checkpoint import load_checkpoint as load_checkpoint
from ._checkpoint import save_checkpoint as save_checkpoint
from ._example import ExampleConfig as ExampleConfig
from ._example import ExampleTask as ExampleTask
from ._example import TinyTransformerLM as TinyTransformerLM
from ._example import count_parameters as count_parameters
from ._node_api import TrainingAllReduce as TrainingAllReduce
from ._node_api import TrainingNode as TrainingNode
from ._node_api import TrainingProgress as TrainingProgress
from ._node_api import TrainingStateSync as TrainingStateSync
from ._node_api import TrainingTracker as TrainingTracker
from ._optimizer import Optimizer as Optimizer
from ._rounds import PendingRound as PendingRound
from ._rounds import RoundInfo as RoundInfo
from ._rounds import RoundResult as RoundResult
from ._rounds import Rounds as Rounds
from ._state_keeping import STATE_FORMAT as STATE_FORMAT
from ._state_keeping import CatchUp as CatchUp
from ._state_keeping import StateKeeper as StateKeeper
from ._strategies import DeDLOCStrategy as DeDLOCStrategy
from ._strategies import DiLoCoStrategy as DiLoCoStrategy
from ._strategies import Strategy as Strategy
from ._task import Task as Task
from ._task import TaskRunner as TaskRunner
from ._task import load_task as load_task
from .config import OptimizerConfig as OptimizerConfig

_LAZY = ("GradientScaler", "GaussianNoise", "WeightInflater", "ALIE", "LyingReducer",
         "Equivocator", "EpochLiar", "ATTACKS")


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from . import _attacks

        value = getattr(_attacks, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
