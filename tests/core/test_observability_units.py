"""Units of the metrics exposition and the log setup; the end-to-end behaviour (two workers,
JSON logs of a real server) is in tests/integration/test_observability.py."""

from __future__ import annotations

import asyncio
import json
import logging
import logging.config
import os
import subprocess
import sys
from pathlib import Path

from router.core.exposition import WorkerProcesses, prepare_multiprocess_dir
from router.core.logs import JsonFormatter, RequestIdFilter, current_request_id, logging_config
from router.gateway.errors import RequestIdMiddleware
from router.request.request_id import SCOPE_KEY
from router.core.metrics import Metrics
from router.core.plain_metrics import PlainFamily

# Labels Prometheus (instance, job) or a Prometheus Operator ServiceMonitor (the rest) put on
# every scraped series: a metric label of the same name would be renamed exported_<name>.
TARGET_LABELS = {"instance", "job", "endpoint", "namespace", "service", "pod", "container", "node"}


def test_no_metric_label_collides_with_a_target_label():
    metrics = Metrics()
    labelled = [m for m in vars(metrics).values() if isinstance(m, PlainFamily)]
    assert len(labelled) >= 14
    for metric in labelled:
        assert not TARGET_LABELS & set(metric.labelnames), metric.name
    engine_labelled = {m.name for m in labelled if "engine" in m.labelnames}
    assert {"pd_router_requests", "pd_router_inflight_requests", "pd_router_instance_healthy",
            "pd_router_estimated_cached_prefix_ratio"} <= engine_labelled


def test_an_engine_that_left_has_no_series_any_more():
    metrics = Metrics()
    for engine in ("a", "b"):
        metrics.requests.labels(engine, "m", "ok").inc()
        metrics.healthy.labels(engine).set(1)
        metrics.cached_ratio.labels(engine).observe(0.5)
    metrics.decisions.labels("ttft", "a").inc()  # a label value that happens to equal the id: not an engine label
    metrics.forget_engine("a")
    r = metrics.registry
    assert r.get_sample_value("pd_router_instance_healthy", {"engine": "a"}) is None
    assert r.get_sample_value("pd_router_requests_total", {"engine": "a", "model": "m", "outcome": "ok"}) is None
    assert r.get_sample_value("pd_router_estimated_cached_prefix_ratio_count", {"engine": "a"}) is None
    assert r.get_sample_value("pd_router_instance_healthy", {"engine": "b"}) == 1
    assert r.get_sample_value("pd_router_decisions_total", {"policy": "ttft", "reason": "a"}) == 1


def test_every_metric_labelled_by_engine_is_forgotten_with_its_engine():
    metrics = Metrics()
    labelled = {id(m) for m in vars(metrics).values() if isinstance(m, PlainFamily) and "engine" in m.labelnames}
    assert labelled == {id(m) for m in metrics.per_engine()}


def test_a_chosen_multiprocess_dir_is_emptied_of_samples_only(tmp_path):
    (tmp_path / "counter_12.db").write_bytes(b"x")
    (tmp_path / "gauge_livesum_12.db").write_bytes(b"x")
    (tmp_path / "README").write_text("mine")
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    assert prepare_multiprocess_dir(env) == str(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README"]


def test_without_a_chosen_dir_a_temporary_one_is_made_and_removed_at_exit(tmp_path):
    code = ("import os; from router.core.exposition import prepare_multiprocess_dir; env = {}; "
            "path = prepare_multiprocess_dir(env); assert env['PROMETHEUS_MULTIPROC_DIR'] == path; "
            "assert os.path.isdir(path); print(path)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert not Path(out.stdout.strip()).exists()


def test_worker_process_metrics_count_live_workers_and_forget_dead_ones(tmp_path):
    dead = 2**22 + 12345  # above the default pid_max: never a live process
    for name in (f"counter_{os.getpid()}.db", f"counter_{dead}.db", f"gauge_livesum_{dead}.db", f"gauge_all_{dead}.db"):
        (tmp_path / name).write_bytes(b"")
    families = {f.name: f for f in WorkerProcesses(str(tmp_path)).collect()}
    # The dead worker's live gauges go (its in-flight requests are over); its counters stay.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"counter_{os.getpid()}.db", f"counter_{dead}.db",
                                                                f"gauge_all_{dead}.db"])
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"} <= set(families)
    [sample] = families["process_cpu_seconds"].samples
    assert sample.name == "process_cpu_seconds_total" and sample.value > 0


def record(msg: str, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("router.test", logging.WARNING, __file__, 1, msg, (), None)
    for key, value in extra.items():
        setattr(rec, key, value)
    RequestIdFilter().filter(rec)
    return rec


def test_json_lines_carry_extras_and_exceptions_and_no_placeholder_id():
    fmt = JsonFormatter()
    plain = json.loads(fmt.format(record("hello %s", engine="p0", color_message="\x1b[1mhello")))
    assert plain["message"] == "hello %s" and plain["engine"] == "p0" and plain["level"] == "warning"
    assert "request_id" not in plain and "color_message" not in plain and plain["ts"].endswith("Z")
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "ValueError: boom" in json.loads(fmt.format(rec))["exc"]


def test_logging_config_is_valid_for_both_formats():
    root, names = logging.getLogger(), ("httpx", "httpcore", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = root.handlers[:], root.level, {n: (logging.getLogger(n).level, logging.getLogger(n).handlers[:]) for n in names}
    try:
        for fmt in ("text", "json"):
            logging.config.dictConfig(logging_config("info", fmt))
            assert logging.getLogger("httpx").level == logging.WARNING and root.level == logging.INFO
        logging.config.dictConfig(logging_config("debug", "text"))
        assert logging.getLogger("httpx").level == logging.WARNING  # never per-request noise
        [handler] = root.handlers
        assert any(isinstance(f, RequestIdFilter) for f in handler.filters)
    finally:  # the process's logging is global: leave it as it was
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name, (level, handlers) in saved[2].items():
            logging.getLogger(name).setLevel(level)
            logging.getLogger(name).handlers[:] = handlers


async def _call(headers: list[tuple[bytes, bytes]]) -> tuple[str, str | None, list]:
    seen: dict = {}
    sent: list = []

    async def inner(scope, receive, send):
        seen["scope_id"] = scope[SCOPE_KEY]
        seen["id"] = current_request_id()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    await RequestIdMiddleware(inner)({"type": "http", "headers": headers}, None, send)  # type: ignore[arg-type]
    return seen["scope_id"], seen["id"], sent[0]["headers"]


def test_request_id_is_kept_when_usable_and_minted_otherwise():
    scope_id, rid, answer = asyncio.run(_call([(b"x-request-id", b"trace-1"), (b"host", b"h")]))
    assert scope_id == rid == "trace-1" and (b"x-request-id", b"trace-1") in answer
    for bad in ([(b"x-request-id", b"has spaces")], []):
        scope_id, rid, answer = asyncio.run(_call(bad))
        assert rid and len(rid) == 32 and scope_id == rid and answer == [(b"x-request-id", rid.encode())]
    assert current_request_id() is None  # reset after the request
