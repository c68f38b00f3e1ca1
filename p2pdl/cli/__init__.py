"""The ``p2pdl`` command (console entry point ``p2pdl.cli:main``; also ``python -m p2pdl``).

    p2pdl node [--listen MULTIADDR ...] [--initial-peers MULTIADDR ...] [--identity FILE]
    p2pdl train [--initial-peers MULTIADDR ...] [--run-id NAME] [--json-lines] ...
    p2pdl monitor --run-id NAME [--initial-peers MULTIADDR ...] [--db FILE] [--http HOST:PORT]
    p2pdl demo [--duration SECONDS] [--out DIR]
    p2pdl identity [--identity FILE]
    p2pdl auth init | issue | revoke | show
    p2pdl netlab check | up | list | cleanup

Modules:

* ``_main`` -- the parser, logging on stderr, dispatch and error reporting.
* ``_args`` -- argument types (positive numbers, durations, peer and run ids...)
  and arguments every peer has.
* ``_runs`` -- the run membership flags of ``train``, ``node`` and ``monitor`` (certificate,
  allowlist, revocations), checked before the node starts.
* ``_format`` -- numbers for JSON (no NaN) and for tables and status lines.
* ``_node`` -- ``p2pdl node``: a long-lived peer, its addresses and status lines.
* ``_train`` -- ``p2pdl train``: one training peer of the example task, its events.
* ``_monitor`` -- ``p2pdl monitor``: follows a run, credits its contributors
  (SQLite), its web dashboard, the live view or status lines, the leaderboard,
  exports.
* ``_monitor_view`` -- the monitor's terminal view (rich).
* ``_demo`` -- ``p2pdl demo``: the swarm phase, then the baseline; signals.
* ``_demo_children`` -- the demo's child processes: start, read events, stop.
* ``_demo_view`` -- the demo's live view (rich) and plain progress lines.
* ``_demo_report`` -- the demo's ``report.json``, ``loss.png`` and summary table.
* ``_identity`` -- ``p2pdl identity``: this peer's id (its identity file created if missing).
* ``_auth`` -- ``p2pdl auth``: a run authority's key, certificates, revocation lists.
* ``_netlab`` -- ``p2pdl netlab``: mounts ``python -m p2pdl.netlab``.

Only subcommands that work are listed.  These modules import torch, rich
and matplotlib only inside the commands that use them.
"""

from ._main import build_parser as build_parser
from ._main import main as main
