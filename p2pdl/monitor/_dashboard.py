"""The monitor's web dashboard: a page, its script, ``/api/state`` and ``/metrics``.

:class:`Dashboard` holds what the views show (the newest
:class:`~p2pdl.monitor.Glance`, a :class:`~p2pdl.monitor.History`, the
credit store's leaderboard) and answers the paths of the monitor's HTTP
server (:func:`serve_dashboard`, on :func:`p2pdl.metrics.serve_http`, so
with the same bounds as ``/metrics``):

* ``/`` -- the page (``dashboard.html``, package data);
* ``/dashboard.js`` -- its script (``dashboard.js``, package data: plain
  JavaScript of this package, no library, nothing fetched from elsewhere, so
  it works offline);
* ``/api/state`` -- the JSON document of :func:`~p2pdl.monitor.run_state`
  (the page reads it every 2 s);
* ``/metrics`` -- the monitor node's Prometheus metrics.

Every answer forbids framing and content sniffing; the page's content
security policy allows scripts, connections and images from the monitor
only.  What peers say of themselves (names) reaches the page as JSON and is
set as text, never as markup.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ..metrics import MetricsConfig, metrics_answer, node_registry, serve_http
from ._history import History, run_state
from ._store import CreditStore

if TYPE_CHECKING:
    from .. import TrioNode
    from ._follow import Glance

__all__ = ["Dashboard", "serve_dashboard", "PAGE_FILES", "LEADERBOARD_ROWS", "STATE_PATH"]

logger = logging.getLogger(__name__)

#: The dashboard's files (package data) by path, with their content types.
PAGE_FILES = {"/": ("dashboard.html", "text/html; charset=utf-8"),
              "/index.html": ("dashboard.html", "text/html; charset=utf-8"),
              "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8")}
#: The path of the JSON state.
STATE_PATH = "/api/state"
#: Leaderboard rows in the state.
LEADERBOARD_ROWS = 50
_SECURITY_HEADERS = [("x-content-type-options", "nosniff"), ("x-frame-options", "DENY"),
                     ("referrer-policy", "no-referrer")]
_PAGE_POLICY = ("default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self'; "
                "style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
                "frame-ancestors 'none'")


class Dashboard:
    """What the monitor's views show of ``run_id``, and the answers of its
    HTTP paths.  Feed it every glance (:meth:`observe`); ``clock`` is the
    wall clock (seconds)."""

    def __init__(self, run_id: str, store: CreditStore, *, history: History | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.run_id = run_id
        self.store = store
        self.history = history or History()
        self.glance: Glance | None = None
        #: the run's backups, shown in the state when set (``status()``)
        self.backups: Any = None
        self._clock = clock
        self._files = {path: (_read(name), kind) for path, (name, kind) in PAGE_FILES.items()}
        self._metrics: Callable[[str], tuple[int, list[tuple[str, str]], bytes]] | None = None

    @property
    def page_bytes(self) -> int:
        """Bytes of the page and its script (what a browser loads first)."""
        return len(self._files["/"][0]) + len(self._files["/dashboard.js"][0])

    def observe(self, glance: Glance) -> None:
        """Take one look at the run (the history keeps its points)."""
        self.glance = glance
        self.history.observe(glance, self._clock())

    def state(self) -> dict[str, Any]:
        """The JSON document of ``/api/state``."""
        state = run_state(self.run_id, self.glance, self.history,
                          self.store.leaderboard(self.run_id, limit=LEADERBOARD_ROWS),
                          self._clock())
        state["backup"] = self.backups.status() if self.backups is not None else None
        return state

    def serve_metrics_of(self, node: TrioNode) -> None:
        """Answer ``/metrics`` with ``node``'s metrics too."""
        self._metrics = metrics_answer(node_registry(node))

    def answer(self, path: str) -> tuple[int, list[tuple[str, str]], bytes]:
        """The answer to a ``GET`` of ``path``."""
        if path in self._files:
            body, kind = self._files[path]
            headers = [("content-type", kind), ("cache-control", "no-cache"),
                       *_SECURITY_HEADERS]
            if kind.startswith("text/html"):
                headers.append(("content-security-policy", _PAGE_POLICY))
            return 200, headers, body
        if path == STATE_PATH:
            body = json.dumps(self.state(), allow_nan=False, separators=(",", ":")).encode()
            return 200, [("content-type", "application/json"), ("cache-control", "no-store"),
                         *_SECURITY_HEADERS], body
        if path == "/metrics" and self._metrics is not None:
            return self._metrics(path)
        return 404, _SECURITY_HEADERS, b"not found; the dashboard is at /\n"


async def serve_dashboard(node: TrioNode, dashboard: Dashboard, address: str, *,
                          config: MetricsConfig | None = None,
                          task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
                          ) -> None:
    """Serve ``dashboard`` (with ``node``'s metrics at ``/metrics``) at
    ``address`` (``HOST:PORT``) until cancelled; ``nursery.start`` returns the
    (host, port) bound.  ConfigError for an address that cannot be bound."""
    dashboard.serve_metrics_of(node)
    await serve_http(address, dashboard.answer, config=config, what="dashboard",
                     task_status=task_status)


def _read(name: str) -> bytes:
    return importlib.resources.files(__package__).joinpath(name).read_bytes()
