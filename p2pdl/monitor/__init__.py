"""Crediting a run's contributors from evidence (docs/monitor.md).

A peer that follows a run's progress (a monitor) credits each peer with the
samples its own signed reports claim at each epoch the run stepped past,
capped at the run's target batch size per peer and epoch, and keeps the
credits in an SQLite database that survives restarts; a leaderboard and
CSV or JSON exports read them.  The monitor's views -- a web dashboard
and a terminal view -- show the run over time.  Modules:

* ``_ledger`` -- :class:`Ledger`: which samples count and when (sans-IO).
* ``_store`` -- :class:`CreditStore`: the credits in SQLite (the schema is
  documented there), the leaderboard and the exports.
* ``_follow`` -- :func:`follow_run`: a node follows a run's progress and
  credits what the view shows (trio).
* ``_history`` -- :class:`History`: the run over time, and
  :func:`run_state`, the document the views show (sans-IO).
* ``_dashboard`` -- :class:`Dashboard` and :func:`serve_dashboard`: the web
  dashboard (its page and script are package data) and ``/api/state``.
* ``_backup`` -- :class:`Backups`: copies of the run's state as atomic
  checkpoints, every N epochs (:class:`BackupConfig`; when: :class:`BackupSchedule`).
"""

from ._backup import BackupConfig as BackupConfig
from ._backup import Backups as Backups
from ._backup import BackupSchedule as BackupSchedule
from ._dashboard import Dashboard as Dashboard
from ._dashboard import serve_dashboard as serve_dashboard
from ._follow import Glance as Glance
from ._follow import follow_run as follow_run
from ._history import History as History
from ._history import run_state as run_state
from ._ledger import Credit as Credit
from ._ledger import Ledger as Ledger
from ._store import SCHEMA_VERSION as SCHEMA_VERSION
from ._store import CreditStore as CreditStore
from ._store import Standing as Standing
