"""A seeded sequence of metric events, for the router's ``Metrics`` and for prometheus_client's own
metric objects built from the same definitions (how the router recorded before plain metrics).

Run as a script (``python metric_events.py new|old SEED``) it applies the sequence in a fresh
process, so that ``PROMETHEUS_MULTIPROC_DIR`` set by the caller puts prometheus_client in
multiprocess mode (chosen when it is first imported)."""

from __future__ import annotations

import random
import sys
import warnings
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from router.core.metrics import Metrics
from router.core.plain_metrics import PlainCounter, PlainGauge, PlainHistogram

VALUES = {"engine": ["a", "b", "c"], "model": ["m", ""], "outcome": ["ok", "upstream_error", "client_disconnect"]}
ENGINES = VALUES["engine"]


def reference(metrics: Metrics, registry: CollectorRegistry) -> dict[str, Any]:
    """prometheus_client objects with the names, help, labels, buckets and modes of ``metrics``."""
    out: dict[str, Any] = {}
    for family in metrics.families():
        args = (family.name, family.documentation, family.labelnames)
        if isinstance(family, PlainCounter):
            out[family.name] = Counter(*args, registry=registry)
        elif isinstance(family, PlainGauge):
            out[family.name] = Gauge(*args, multiprocess_mode=family.multiprocess_mode, registry=registry)
        else:
            out[family.name] = Histogram(*args, buckets=family.bounds, registry=registry)
    return out


def apply_events(metrics: Metrics, record: Callable[[str], Any], forget: Callable[[str], None], seed: int,
                 events: int = 600, export: Callable[[], None] | None = None) -> None:
    """``record(name)`` gives the metric to record into; the same seed makes the same sequence
    for either implementation (``metrics`` only lends the definitions)."""
    rng = random.Random(seed)
    families = metrics.families()
    for _ in range(events):
        roll = rng.random()
        if roll < 0.03:
            forget(rng.choice(ENGINES))
            continue
        if roll < 0.08:  # a copy to the multiprocess files in between (the same draws either way)
            if export is not None:
                export()
            continue
        family = rng.choice(families)
        labels = [rng.choice(VALUES.get(name, ["x", "y"])) for name in family.labelnames]
        child = record(family.name).labels(*labels)
        if isinstance(family, PlainCounter):
            child.inc(rng.choice([1, 1, 0, 2.5, 640]))
        elif isinstance(family, PlainGauge):
            if family.multiprocess_mode == "livemostrecent":
                child.set(rng.choice([0, 1, 0.75]))
            elif rng.random() < 0.5:
                child.inc()
            else:
                child.dec(rng.choice([1, 2]))
        elif isinstance(family, PlainHistogram):
            bound = rng.choice(family.bounds[:-1])  # on a bound (inclusive), around it, or past the last
            child.observe(rng.choice([bound, bound * 1.01, bound * 0.99, bound * 3, rng.uniform(0, bound)]))


def run(kind: str, seed: int) -> None:
    """Apply the events with one implementation, leaving its samples in this process's files."""
    metrics = Metrics()
    assert metrics.multiprocess_path, "run me with PROMETHEUS_MULTIPROC_DIR set"
    if kind == "new":
        by_name = {f.name: f for f in metrics.families()}
        apply_events(metrics, by_name.__getitem__, metrics.forget_engine, seed, export=metrics.export)
        metrics.export()
        return
    old = reference(metrics, CollectorRegistry())
    engine_labelled = [old[f.name] for f in metrics.per_engine()]

    def forget(engine: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not implemented in multi-process mode": the files keep it
            for metric in engine_labelled:
                metric.remove_by_labels({"engine": engine})

    apply_events(metrics, old.__getitem__, forget, seed)


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]))
