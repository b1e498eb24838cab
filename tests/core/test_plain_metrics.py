"""The router's plain metrics show on /metrics exactly what prometheus_client's own objects showed
after the same events: names, help, types, labels, buckets, ``_created``, order, forgotten
engines; and under ``--workers N`` the multiprocess files sum to what they summed to before."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from metric_events import apply_events, reference
from router.core.metrics import Metrics
from router.core.plain_metrics import PlainCollector, PlainFamily

ROOT = Path(__file__).resolve().parents[2]


def _old_forget(metrics: Metrics, old: dict):
    def forget(engine: str) -> None:
        for family in metrics.per_engine():
            old[family.name].remove_by_labels({"engine": engine})
    return forget


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_exposition_is_prometheus_clients_after_the_same_events(monkeypatch, seed):
    monkeypatch.setattr(time, "time", lambda: 1764590000.125)  # the _created samples of both
    new, old_registry = Metrics(), CollectorRegistry()
    old = reference(new, old_registry)
    by_name = {f.name: f for f in new.families()}
    apply_events(new, by_name.__getitem__, new.forget_engine, seed)
    apply_events(new, old.__getitem__, _old_forget(new, old), seed)
    plain = CollectorRegistry()
    plain.register(PlainCollector(new.families()))
    text = generate_latest(plain).decode()
    assert text == generate_latest(old_registry).decode()
    assert 'le="+Inf"' in text and "_created" in text and 'engine="a"' in text  # the events reached them
    served = new.exposition().decode()
    assert served.startswith(text) and "pd_router_build_info" in served and "process_cpu_seconds_total" in served


def test_without_created_series_neither_shows_them(monkeypatch):
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "true")
    metrics = Metrics()
    metrics.requests.labels("a", "m", "ok").inc()
    metrics.latency.labels("a", "m", "ok").observe(0.2)
    text = metrics.exposition().decode()
    assert "pd_router_requests_total{" in text and "_created" not in text


def test_every_recorded_metric_is_rendered_and_forgotten_engines_start_again():
    metrics = Metrics()
    families = {id(v) for v in vars(metrics).values() if isinstance(v, PlainFamily)}
    assert families == {id(f) for f in metrics.families()} and len(families) == len(metrics.families())
    metrics.child("requests", "a", "m", "ok").inc(3)
    metrics.forget_engine("a")
    metrics.child("requests", "a", "m", "ok").inc()  # the cached child went with the engine
    assert metrics.registry.get_sample_value("pd_router_requests_total", {"engine": "a", "model": "m", "outcome": "ok"}) == 1


def test_bad_records_are_refused_as_prometheus_client_refuses_them():
    metrics = Metrics()
    with pytest.raises(ValueError):
        metrics.requests.labels("a", "m", "ok").inc(-1)
    with pytest.raises(ValueError):
        metrics.requests.labels("a", "m")
    with pytest.raises(ValueError):
        metrics.requests.remove_by_labels({"instance": "a"})
    metrics.latency.labels("a", "m", "ok").observe(math.nan)  # no bucket, a NaN sum: as prometheus_client
    assert metrics.registry.get_sample_value("pd_router_request_duration_seconds_count",
                                             {"engine": "a", "model": "m", "outcome": "ok"}) == 0


def _workers(kind: str, path: Path, seeds: list[int]) -> dict:
    """Run one worker process per seed into ``path``; the summed samples, as any scrape reads them."""
    path.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(path),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])}
    for seed in seeds:
        subprocess.run([sys.executable, str(Path(__file__).parent / "metric_events.py"), kind, str(seed)],
                       env=env, check=True, timeout=120)
    out = {}
    for family in MultiProcessCollector(None, path=str(path)).collect():  # type: ignore[no-untyped-call]
        for s in family.samples:
            out[(family.name, family.type, family.documentation, s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_two_workers_files_sum_to_what_prometheus_clients_multiprocess_metrics_wrote(tmp_path):
    old = _workers("old", tmp_path / "old", [4, 5])
    new = _workers("new", tmp_path / "new", [4, 5])
    assert set(new) == set(old)
    assert any(k[3].endswith("_bucket") for k in new) and any(k[1] == "gauge" for k in new)
    for key, value in old.items():  # a sum of deltas rounds differently from a sum of samples
        assert new[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


def test_an_engines_series_show_once_recorded_and_go_with_the_engine(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1764590000.125)
    bundled, plain = Metrics(), Metrics()
    for engine in ("a", "b", "a"):
        series = bundled.engine(engine)
        series.inflight.inc()
        series.ttfb.observe(0.01)
        requests, latency = series.outcome("m", "ok")
        requests.inc()
        latency.observe(0.02)
        for metric in bundled.decided("ttft", "score", "colocated"):
            metric.observe(0.001) if hasattr(metric, "observe") else metric.inc()
        plain.child("inflight", engine).inc()
        plain.child("ttfb", engine).observe(0.01)
        plain.child("requests", engine, "m", "ok").inc()
        plain.child("latency", engine, "m", "ok").observe(0.02)
        plain.child("store_latency", "decide").observe(0.001)
        plain.child("decisions", "ttft", "score").inc()
        plain.child("modes", "colocated").inc()
    text = bundled.exposition().decode()
    assert "pd_router_estimated_cached_prefix_ratio_count" not in text  # never recorded: no series
    assert text.split("# HELP pd_router_build_info")[0] == plain.exposition().decode().split("# HELP pd_router_build_info")[0]
    bundled.forget_engine("a")
    bundled.engine("a").inflight.inc()  # a fresh series, not the forgotten child
    assert bundled.registry.get_sample_value("pd_router_inflight_requests", {"engine": "a"}) == 1
    assert bundled.registry.get_sample_value("pd_router_requests_total", {"engine": "a", "model": "m", "outcome": "ok"}) is None
    assert bundled.registry.get_sample_value("pd_router_requests_total", {"engine": "b", "model": "m", "outcome": "ok"}) == 1
