"""A matchmaking peer in its own process, for tests that kill it (SIGKILL).

    python tests/averaging/matchmaking/mm_peer.py INITIAL_PEER TARGET MATCHMAKING_TIME JOIN_WINDOW

Prints ``{"peer_id": ...}`` once its DHT has contacts, then reads one line
``RUN_ID EPOCH`` from stdin and calls ``form_group``; prints ``{"event":
"announced"}`` once its announcement is in the DHT, and at the end
``{"group": [peer ids]}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import trio

from p2pdl import NodeConfig
from p2pdl.averaging import MatchmakingConfig
from p2pdl.testing import loopback_config, wait_for_dht


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main(addr: str, target: int, matchmaking_time: float, join_window: float) -> None:
    import p2pdl

    config = dataclasses.replace(
        loopback_config(), matchmaking=MatchmakingConfig(
            target_group_size=target, matchmaking_time=matchmaking_time,
            join_window=join_window))
    async with p2pdl.open_node(NodeConfig.build(config, initial_peers=[addr])) as node:
        await wait_for_dht([node], contacts=1)
        announce = node.dht.announce

        async def announce_and_say(*args: object) -> bool:
            ok = await announce(*args)
            say(event="announced")
            return ok

        node.dht.announce = announce_and_say  # type: ignore[method-assign]
        say(peer_id=str(node.peer_id))
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        run_id, epoch = line.split()
        try:
            group = await node.matchmaking.form_group(run_id, int(epoch))
        except p2pdl.P2PDLError as exc:
            say(error=str(exc))
        else:
            say(group=[str(p) for p in group.peer_ids])
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
