"""The node's configuration: each layer's settings in one frozen record."""

from __future__ import annotations

import dataclasses
from typing import Any

from .averaging import AllReduceConfig, MatchmakingConfig
from .dht import DHTConfig, Schema
from .errors import ConfigError
from .membership import MembershipConfig
from .nat import NatConfig
from .net import HostConfig
from .progress import ProgressConfig
from .statesync import StateSyncConfig
from .wire import WireConfig

__all__ = ["NodeConfig"]


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs: each layer's settings.

    ``dht_schemas`` are the rules for DHT key prefixes this node validates
    (besides the built-in ones); every node of a collaboration should have
    the same.
    """

    host: HostConfig = HostConfig()
    wire: WireConfig = WireConfig()
    nat: NatConfig = NatConfig()
    dht: DHTConfig = DHTConfig()
    dht_schemas: tuple[Schema, ...] = ()
    membership: MembershipConfig = MembershipConfig()
    progress: ProgressConfig = ProgressConfig()
    matchmaking: MatchmakingConfig = MatchmakingConfig()
    allreduce: AllReduceConfig = AllReduceConfig()
    statesync: StateSyncConfig = StateSyncConfig()

    @classmethod
    def build(cls, config: NodeConfig | None = None, **host_fields: Any) -> NodeConfig:
        """``config`` with the given :class:`HostConfig` fields replaced.

        Accepts ``listen``, ``announce``, ``initial_peers``, ``identity_path``
        and the other HostConfig fields; lists are fine.
        """
        config = config or cls()
        if not host_fields:
            return config
        known = {f.name for f in dataclasses.fields(HostConfig)}
        unknown = sorted(set(host_fields) - known)
        if unknown:
            raise ConfigError(f"unknown node option(s): {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(known))})")
        for name in ("listen", "announce", "initial_peers"):
            if isinstance(host_fields.get(name), str):
                host_fields[name] = (host_fields[name],)
        if host_fields.get("identity_path") is not None:
            host_fields["identity_path"] = str(host_fields["identity_path"])
        return dataclasses.replace(config, host=dataclasses.replace(config.host, **host_fields))
