"""Prometheus metrics of a running node: ``/metrics`` over HTTP (docs/metrics.md).

``p2pdl node --metrics ADDR`` and ``p2pdl train --metrics ADDR`` serve them;
from Python, ``await nursery.start(serve_metrics, node, "127.0.0.1:9100")``
(trio) or ``start_metrics(node, "127.0.0.1:9100")`` (a sync
:class:`~p2pdl.Node`).  Modules:

* ``config`` -- :class:`MetricsConfig`: the HTTP server's bounds (documented defaults).
* ``_families`` -- :func:`metric_families`: a node's ``statistics()`` as
  Prometheus metric families, by one naming rule (sans-IO).
* ``_http`` -- :func:`serve_http`: a small bounded HTTP/1.1 server (h11 on
  trio) of ``GET`` answers; :func:`serve_metrics`, :func:`start_metrics`: it
  answering ``GET /metrics`` in the node's nursery (the monitor's dashboard
  serves on it too).
"""

from ._families import NodeCollector as NodeCollector
from ._families import metric_families as metric_families
from ._families import metrics_text as metrics_text
from ._families import node_registry as node_registry
from ._http import METRICS_PATH as METRICS_PATH
from ._http import Answer as Answer
from ._http import metrics_answer as metrics_answer
from ._http import parse_address as parse_address
from ._http import serve_http as serve_http
from ._http import serve_metrics as serve_metrics
from ._http import start_metrics as start_metrics
from .config import MetricsConfig as MetricsConfig
