"""Helpers shared by the tests, the simulations and users: real nodes on loopback.

* :func:`open_nodes` -- N nodes in this trio run, connected through the first.
* :func:`open_node_process`, :func:`open_node_processes` -- ``p2pdl node`` child
  processes and their addresses.
* :func:`loopback_config` -- a :class:`~p2pdl.NodeConfig` listening on loopback only.
* :func:`task_names` -- every task of the trio run, to check that nothing is left over.
"""

from ._swarm import LOOPBACK as LOOPBACK
from ._swarm import NodeProcess as NodeProcess
from ._swarm import loopback_config as loopback_config
from ._swarm import open_node_process as open_node_process
from ._swarm import open_node_processes as open_node_processes
from ._swarm import open_nodes as open_nodes
from ._swarm import task_names as task_names
