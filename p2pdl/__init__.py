"""p2pdl: collaborative deep learning over the internet (DeDLOC), on py-libp2p.

Layers, bottom to top; a layer imports only the layers below it
(docs/architecture.md has the map):

* ``p2pdl.errors`` -- the error types every layer raises.
* ``p2pdl.net`` -- the libp2p host: TCP + Noise + Yamux, identity, peers, relays,
  hole punching.
* ``p2pdl.wire`` -- framing, typed messages, tensor frames, flow control, RPC.
* ``p2pdl.service`` -- the service contract every protocol keeps, and the
  admission gate every inbound request passes.
* ``p2pdl.nat`` -- reachability by dial-back, client mode, relay use.
* ``p2pdl.dht`` -- Kademlia DHT: discovery, signed dictionary records (``node.dht``).
* ``p2pdl.membership`` -- who may touch a run: open, allowlist and certificate runs,
  the membership handshake, revocation (``node.membership``).
* ``p2pdl.progress`` -- gossip of training progress, when to step (``node.progress``).
* ``p2pdl.statesync`` -- training state for joiners (``node.statesync``).
* ``p2pdl.averaging`` -- matchmaking of averaging groups (``node.matchmaking``) and
  the butterfly all-reduce (``node.allreduce``).
* ``p2pdl.training`` -- the PyTorch adapter, :class:`Optimizer` (loads torch;
  imported only when one of its names is used).
* the node -- ``_node`` (:func:`open_node`, :class:`TrioNode`, the services built
  in one loop), ``_sync_node`` (:class:`Node` for sync code, ``node.aio`` for
  asyncio), with ``_config`` (:class:`NodeConfig`), ``_portal`` (the one bridge
  between threads and the node's trio thread) and ``_faces`` (each service's
  sync and asyncio face).
* ``p2pdl.metrics`` -- Prometheus metrics of a running node (``--metrics``).
* ``p2pdl.monitor`` -- following a run and crediting its contributors
  (``p2pdl monitor``).
* ``p2pdl.cli`` -- the ``p2pdl`` command.
* ``p2pdl.testing`` -- real nodes on loopback for tests and simulations.
* ``p2pdl.hf`` -- a ``transformers.Trainer`` that trains with the swarm
  (``pip install p2pdl[hf]``; imported only when imported by name).
* ``p2pdl.netlab`` -- the emulated internet (network namespaces, NAT, caps).
"""

from ._config import NodeConfig as NodeConfig
from ._node import SERVICES as SERVICES
from ._node import NodeStatistics as NodeStatistics
from ._node import ServiceEntry as ServiceEntry
from ._node import TrioNode as TrioNode
from ._node import open_node as open_node
from ._portal import Portal as Portal
from ._sync_node import AsyncioNode as AsyncioNode
from ._sync_node import Node as Node
from ._version import __version__ as __version__
from .averaging import Group as Group
from .averaging import MatchmakingConfig as MatchmakingConfig
from .dht import DHTConfig as DHTConfig
from .dht import Schema as Schema
from .dht import ValueWithExpiration as ValueWithExpiration
from .errors import CallTimeoutError as CallTimeoutError
from .errors import CheckpointError as CheckpointError
from .errors import ConfigError as ConfigError
from .errors import IdentityError as IdentityError
from .errors import LocalProtocolError as LocalProtocolError
from .errors import MatchmakingFailedError as MatchmakingFailedError
from .errors import NodeClosedError as NodeClosedError
from .errors import P2PDLError as P2PDLError
from .errors import PeerUnreachableError as PeerUnreachableError
from .errors import ProtocolNotSupportedError as ProtocolNotSupportedError
from .errors import RemoteError as RemoteError
from .errors import RemoteProtocolError as RemoteProtocolError
from .errors import RequestError as RequestError
from .errors import StateSyncError as StateSyncError
from .errors import StreamClosedError as StreamClosedError
from .errors import TaskError as TaskError
from .membership import AllowlistRun as AllowlistRun
from .membership import Authority as Authority
from .membership import Certificate as Certificate
from .membership import CertificateRun as CertificateRun
from .membership import MembershipConfig as MembershipConfig
from .membership import OpenRun as OpenRun
from .membership import RevocationList as RevocationList
from .net import HostConfig as HostConfig
from .progress import GlobalProgress as GlobalProgress
from .progress import ProgressConfig as ProgressConfig
from .service import AdmissionGate as AdmissionGate
from .service import OpenAdmission as OpenAdmission
from .service import Refusal as Refusal
from .service import Role as Role
from .statesync import StateDownload as StateDownload
from .statesync import StateSyncConfig as StateSyncConfig
from .wire import Message as Message
from .wire import RpcProtocol as RpcProtocol
from .wire import WireConfig as WireConfig

# The training layer needs torch; import it only when one of its names is used,
# so that ``import p2pdl`` (the networking stack alone) does not load torch.
_LAZY = {"Optimizer": "training", "OptimizerConfig": "training"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

