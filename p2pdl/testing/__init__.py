"""Helpers shared by the tests, the simulations and users: real nodes on
loopback, in child processes, or on an in-memory network.

Modules:

* ``_swarm`` -- :func:`open_nodes` (N nodes in this trio run, connected through
  the first), :func:`open_node_process` and :func:`open_node_processes`
  (``p2pdl node`` child processes and their addresses), :func:`loopback_config`,
  :func:`wait_for_dht` (until routing tables are filled), :func:`wait_until`
  (until a condition holds, polled on trio's clock) and :func:`task_names`
  (every task of the trio run, to check that nothing is left over).
* ``_memory_swarm`` -- :func:`open_memory_nodes`, :func:`open_memory_swarm`: real
  nodes on an in-memory network, without sockets; with :func:`trio_clock` their
  wall clock follows trio's, so under a ``MockClock`` their timeouts take no time.
* ``_memory`` -- :class:`MemoryNetwork`, :class:`MemoryHost`,
  :func:`open_memory_host`: the in-memory hosts a node runs on, and what a test
  does to their network (kill, disconnect, partition, heal).
* ``_memory_stream`` -- :class:`MemoryStream`, :func:`memory_stream_pair`: in-memory
  streams that behave like py-libp2p's (ordered, bounded, half-close, reset).
* ``_agent`` -- :func:`open_agent`: a node process driven by JSON commands
  (status, connect, ping, send), for scenarios across processes and network
  namespaces; ``agent`` is its ``python -m`` entry point.
* ``_swarm_agent`` -- :func:`open_swarm_agents`: processes of several nodes each
  (``python -m p2pdl.testing.swarm_agent``, entry point ``swarm_agent``), driven
  by JSON commands (DHT store/get), for scenarios with many nodes.
* ``_progress_sim`` -- :func:`simulate_progress`: simulated trainers on nodes,
  reporting progress by gossip or by DHT polling (``simulations/bench_progress.py``).
* ``_attackers`` -- :class:`WeightInflater`, :class:`GradientScaler`,
  :class:`GaussianNoise`, :class:`ALIE`, :class:`LyingReducer`,
  :class:`EpochLiar`: real
  :class:`p2pdl.Optimizer` members that misbehave on purpose (a huge claimed
  batch with flipped gradients; scaled, noisy or subtly pushed gradients; a
  shifted result as a reducer; a far newer epoch with a poisoned state),
  ``ATTACKS`` (each kind of ``p2pdl train --attack`` and ``p2pdl demo
  --attacker`` as a wrapper of an optimizer; all from ``p2pdl.training``),
  :func:`flagged` (what a node's flag book caught), :func:`train_swarm` (honest
  peers and attackers training the example together: a :class:`SwarmOutcome`)
  and :func:`loopback_swarm` (sync nodes, optionally members of a certificate
  run); docs/testing.md.  They need torch, so they are imported when first used.
* ``_churn`` -- :func:`churn_run`: a swarm training a small regression task
  (:class:`RegressionTask`) while peers are killed (mid-round, while serving
  a download, or any time) and replaced by fresh volunteers; a
  :class:`ChurnOutcome` (``simulations/bench_churn.py``).  Torch too.
"""

from ._agent import Agent as Agent
from ._agent import AgentError as AgentError
from ._agent import open_agent as open_agent
from ._memory import MemoryHost as MemoryHost
from ._memory import MemoryNetwork as MemoryNetwork
from ._memory import MemoryNetworkStatistics as MemoryNetworkStatistics
from ._memory import open_memory_host as open_memory_host
from ._memory_stream import DEFAULT_WINDOW as DEFAULT_WINDOW
from ._memory_stream import Link as Link
from ._memory_stream import MemoryStream as MemoryStream
from ._memory_stream import memory_stream_pair as memory_stream_pair
from ._memory_swarm import MemorySwarm as MemorySwarm
from ._memory_swarm import open_memory_nodes as open_memory_nodes
from ._memory_swarm import open_memory_swarm as open_memory_swarm
from ._memory_swarm import trio_clock as trio_clock
from ._progress_sim import simulate_progress as simulate_progress
from ._swarm import LOOPBACK as LOOPBACK
from ._swarm import NodeProcess as NodeProcess
from ._swarm import loopback_config as loopback_config
from ._swarm import open_node_process as open_node_process
from ._swarm import open_node_processes as open_node_processes
from ._swarm import open_nodes as open_nodes
from ._swarm import task_names as task_names
from ._swarm import wait_for_dht as wait_for_dht
from ._swarm import wait_until as wait_until
from ._swarm_agent import open_swarm_agents as open_swarm_agents

# The attackers need torch; import them only when one of their names is used,
# so that ``import p2pdl.testing`` does not load torch.
_LAZY = {name: "_attackers" for name in (
    "WeightInflater", "GradientScaler", "GaussianNoise", "ALIE", "LyingReducer", "EpochLiar",
    "ATTACKS", "flagged", "SwarmOutcome", "train_swarm", "loopback_swarm")}

_LAZY.update({name: "_churn" for name in (
    "RegressionTask", "ChurnConfig", "ChurnOutcome", "churn_run")})


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
