"""A node's statistics as Prometheus metric families, by one naming rule (sans-IO).

Every field of ``node.statistics()`` becomes a metric named after its path,
``p2pdl_<field>`` for the node's own fields and ``p2pdl_<service>_<field>``
for a service's (``p2pdl_dht_queries_total``):

* a counter of a record (a field that counts up from 0,
  :meth:`~p2pdl.service.Statistics.counter_names`) is a **counter**
  (``_total``); every other number, and a boolean (0 or 1), a **gauge**;
* a text (``reachability``, the DHT's ``mode``) is a gauge
  ``<name>_info`` of value 1 with the text as a label of the field's name
  (``p2pdl_reachability_info{reachability="public"} 1``);
* a dictionary of numbers is one metric with its keys as a label
  (DICT_LABELS names it: ``p2pdl_paths{path="relayed"}``);
* a list of per-run records is one metric per field with a ``run_id``
  label; a list of anything else, a gauge of its length.

Each run a node tracks adds its tracker's statistics as
``p2pdl_progress_runs_<field>{run_id=...}`` and its view of the run's
progress as ``p2pdl_progress_view_<field>{run_id=...}`` (epoch, samples,
peers, samples per second, the time to the next epoch...).

A service added to the node appears by the same rule, with no change here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..service import Statistics

__all__ = ["PREFIX", "DICT_LABELS", "metric_families", "NodeCollector", "metrics_text",
           "node_registry", "node_reading"]

#: The first word of every metric name.
PREFIX = "p2pdl"
#: The label of each dictionary of a node's statistics, by the field's name
#: (any other dictionary's label is ``key``).
DICT_LABELS = {"paths": "path", "refused_by_protocol": "protocol",
               "protocol_errors": "protocol", "timeouts": "protocol"}


def metric_families(statistics: Any, runs: Iterable[tuple[str, Any, Any]] = ()
                    ) -> list[Metric]:
    """The metric families of a statistics record (``node.statistics()``) and
    of the runs it tracks: ``(run_id, tracker statistics, global progress)``."""
    families: dict[str, Metric] = {}
    _walk(statistics, (), False, {}, families)
    for run_id, tracker, view in runs:
        _walk(tracker, ("progress", "runs"), False, {"run_id": run_id}, families)
        _walk(view, ("progress", "view"), False, {"run_id": run_id}, families)
    return list(families.values())


def node_reading(node: Any) -> Callable[[], tuple[Any, list[tuple[str, Any, Any]]]]:
    """What a scrape of ``node`` (a :class:`~p2pdl.TrioNode`) reads: its
    statistics, and each tracked run's tracker statistics and progress view
    (on the node's trio thread)."""
    def read() -> tuple[Any, list[tuple[str, Any, Any]]]:
        statistics = node.statistics()
        runs = []
        for run_id in getattr(statistics["progress"], "runs", ()):
            tracker = node.progress.tracker(run_id)
            if tracker is not None:
                runs.append((run_id, tracker.statistics(), tracker.global_progress()))
        return statistics, runs
    return read


def _walk(value: Any, path: tuple[str, ...], counter: bool, labels: dict[str, str],
          out: dict[str, Metric]) -> None:
    name = "_".join((PREFIX, *path))
    if isinstance(value, bool):
        _add(out, name, GaugeMetricFamily, path, labels, float(value))
    elif isinstance(value, (int, float)):
        _add(out, name, CounterMetricFamily if counter else GaugeMetricFamily, path, labels,
             float(value))
    elif isinstance(value, (str, enum.Enum)) and path:
        text = value.value if isinstance(value, enum.Enum) else value
        _add(out, f"{name}_info", GaugeMetricFamily, path,
             {**labels, path[-1]: str(text)}, 1.0)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        counters = set(value.counter_names()) if isinstance(value, Statistics) else set()
        for field in dataclasses.fields(value):
            if field.name in labels:   # already a label (a run's id)
                continue
            _walk(getattr(value, field.name), (*path, field.name), field.name in counters,
                  labels, out)
    elif isinstance(value, Mapping) and path:
        label = DICT_LABELS.get(path[-1], "key")
        for key, item in value.items():
            if isinstance(item, (int, float)):
                _walk(item, path, counter, {**labels, label: str(key)}, out)
    elif isinstance(value, (list, tuple)) and path:
        runs = [item for item in value if isinstance(getattr(item, "run_id", None), str)]
        if runs and len(runs) == len(value):
            for item in runs:
                _walk(item, path, False, {**labels, "run_id": item.run_id}, out)
        else:
            _add(out, name, GaugeMetricFamily, path, labels, float(len(value)))


def _add(out: dict[str, Metric], name: str, kind: type, path: tuple[str, ...],
         labels: dict[str, str], value: float) -> None:
    family = out.get(name)
    if family is None:
        family = out[name] = kind(name, f"p2pdl statistics: {'.'.join(path)}",
                                  labels=sorted(labels))
    if family.samples and sorted(family.samples[0].labels) != sorted(labels):
        return   # a record whose labels differ from its family's: left out
    family.add_metric([labels[k] for k in sorted(labels)], value)


class NodeCollector:
    """A Prometheus collector of ``read()`` (:func:`node_reading`: a node's
    statistics and runs), read at every scrape."""

    def __init__(self, read: Callable[[], tuple[Any, Iterable[tuple[str, Any, Any]]]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        statistics, runs = self._read()
        return metric_families(statistics, runs)


def node_registry(node: Any, *, process: bool = True) -> CollectorRegistry:
    """A registry of ``node``'s metrics (:class:`NodeCollector`) and, with
    ``process``, the process's (CPU seconds, memory, open files: ``process_*``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node_reading(node)))   # type: ignore[arg-type]
    if process:
        ProcessCollector(registry=registry)
    return registry


def metrics_text(node: Any) -> bytes:
    """The text exposition of ``node``'s metrics now (a :class:`~p2pdl.TrioNode`,
    on its trio thread)."""
    return generate_latest(node_registry(node, process=False))
