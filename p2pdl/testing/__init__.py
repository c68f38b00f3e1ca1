"""Helpers shared by the tests, the simulations and users: real nodes on loopback.

* :func:`open_nodes` -- N nodes in this trio run, connected through the first.
* :func:`open_node_process`, :func:`open_node_processes` -- ``p2pdl node`` child
  processes and their addresses.
* :func:`loopback_config` -- a :class:`~p2pdl.NodeConfig` listening on loopback only.
* :func:`open_agent` -- a node process driven by JSON commands (status, connect,
  ping, send), for scenarios across processes and network namespaces.
* :func:`wait_for_dht` -- until in-process nodes' DHT routing tables are filled.
* :func:`open_swarm_agents` -- processes of several nodes each
  (``python -m p2pdl.testing.swarm_agent``), driven by JSON commands (DHT
  store/get), for scenarios with many nodes.
* :func:`simulate_progress` -- simulated trainers on nodes, reporting progress by
  gossip or by DHT polling (``simulations/bench_progress.py``).
* :func:`task_names` -- every task of the trio run, to check that nothing is left over.
"""

from ._agent import Agent as Agent
from ._agent import AgentError as AgentError
from ._agent import open_agent as open_agent
from ._progress_sim import simulate_progress as simulate_progress
from ._swarm import LOOPBACK as LOOPBACK
from ._swarm import NodeProcess as NodeProcess
from ._swarm import loopback_config as loopback_config
from ._swarm import open_node_process as open_node_process
from ._swarm import open_node_processes as open_node_processes
from ._swarm import open_nodes as open_nodes
from ._swarm import task_names as task_names
from ._swarm import wait_for_dht as wait_for_dht
from ._swarm_agent import open_swarm_agents as open_swarm_agents
