"""Metrics and logs of a real ``pd-router serve`` process: two workers behind one port report one
set of counters (the sum over both, the same on every scrape), process and build metrics are
there, and JSON log lines carry the request id the engines received."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

import router
from router.tools.localrun import router_process
from servers import FakeBackend, serve_app

PROMPT = "A system prompt long enough to hash into several blocks for this test. " * 20
SECRET_WORDS = "zebra-umbrella-quartz"  # in every prompt; must never reach a log line


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(text: str, name: str) -> float:
    return sum(samples(text, name).values())


def per_worker_requests(metrics_dir: Path) -> dict[int, float]:
    """pd_router_requests_total as each worker process wrote it to its own file."""
    out = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        values = [v for key, v, _, _ in MmapedDict.read_all_values_from_file(str(path))
                  if json.loads(key)[1] == "pd_router_requests_total"]
        out[pid] = sum(values)
    return out


def config_for(stack: ExitStack, backends: list[FakeBackend], **state) -> dict:
    urls = [stack.enter_context(serve_app(b.app())) for b in backends]
    return {
        "instances": [{"url": u, "name": b.name, "model": "m"} for u, b in zip(urls, backends)],
        "health": {"interval_s": 0.5},
        **({"state": state} if state else {}),
    }


def completion(i: int, stream: bool = False) -> dict:
    return {"model": "m", "prompt": f"{PROMPT} {SECRET_WORDS} question {i}", "max_tokens": 4, "stream": stream}


def test_two_workers_report_the_sum_of_their_counters(redis_url, key_prefix, tmp_path, monkeypatch):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    # A previous run's file: serve must empty the directory, or its 1000 requests would count.
    stale = MmapedDict(str(metrics_dir / "counter_999999.db"))
    stale.write_value(mmap_key("pd_router_requests", "pd_router_requests_total", ["engine", "model", "outcome"],
                               ["a", "m", "ok"], "stale"), 1000.0, 0.0)
    stale.close()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    backends = [FakeBackend("a"), FakeBackend("b")]
    with ExitStack() as stack:
        config = config_for(stack, backends, backend="redis", redis_url=redis_url, key_prefix=key_prefix)
        proc = stack.enter_context(router_process(config, args=["--workers", "2", "--log-format", "json", "--log-level", "info"]))
        assert not (metrics_dir / "counter_999999.db").exists()
        sent = 0
        # New connections land on either worker; keep going (bounded) until both have served some.
        while sent < 40 or len([n for n in per_worker_requests(metrics_dir).values() if n]) < 2:
            assert sent < 400, f"one worker took every request: {per_worker_requests(metrics_dir)}"
            assert httpx.post(f"{proc.url}/v1/completions", json=completion(sent, stream=sent % 2 == 0)).status_code == 200
            sent += 1
        deadline = time.monotonic() + 10
        while sum(per_worker_requests(metrics_dir).values()) < sent and time.monotonic() < deadline:
            time.sleep(0.05)  # the last stream's counter is written just after its last byte
        workers = per_worker_requests(metrics_dir)
        assert sum(workers.values()) == sent and len([n for n in workers.values() if n]) == 2, workers

        time.sleep(1.5)  # each worker copies its state-store counters out every second
        scrapes = [httpx.get(f"{proc.url}/metrics").text for _ in range(12)]
        log_text = Path(proc.log_path).read_text()

    for text in scrapes:  # whichever worker answered: the same sum
        assert total(text, "pd_router_requests_total") == sent
        assert {dict(k)["model"] for k in samples(text, "pd_router_requests_total")} == {"m"}
        assert total(text, "pd_router_request_duration_seconds_count") == sent
        assert total(text, "pd_router_decisions_total") >= sent
        [(build, one)] = samples(text, "pd_router_build_info").items()
        assert dict(build)["version"] == router.__version__ and one == 1
        assert total(text, "process_resident_memory_bytes") > 0
        assert total(text, "pd_router_inflight_requests") == 0
        assert set(samples(text, "pd_router_instance_healthy").values()) == {1.0}
    round_trips = [total(t, "pd_router_state_round_trips_total") for t in scrapes]
    assert round_trips[0] >= sent and round_trips == sorted(round_trips), round_trips  # summed, never backwards
    cpu = [total(t, "process_cpu_seconds_total") for t in scrapes]
    assert cpu == sorted(cpu), cpu

    lines = [json.loads(line) for line in log_text.splitlines() if line.strip()]  # every line is JSON
    request_lines = [entry for entry in lines if entry["message"].startswith("request ")]
    assert len(request_lines) == sent
    assert all(entry["message"].startswith(f"request {entry['request_id']} ") for entry in request_lines)
    assert len({entry["request_id"] for entry in request_lines}) == sent
    assert SECRET_WORDS not in log_text


def test_json_logs_carry_the_request_id_the_engine_received(tmp_path):
    backend = FakeBackend("a")
    with ExitStack() as stack:
        config = config_for(stack, [backend])
        proc = stack.enter_context(router_process(config, args=["--log-format", "json", "--log-level", "info"]))
        given = httpx.post(f"{proc.url}/v1/completions", json=completion(1, stream=True), headers={"x-request-id": "trace-42"})
        minted = httpx.post(f"{proc.url}/v1/completions", json=completion(2), headers={"x-request-id": "bad id with spaces"})
        assert given.status_code == minted.status_code == 200
        deadline = time.monotonic() + 5
        while Path(proc.log_path).read_text().count('"request ') < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        log_text = Path(proc.log_path).read_text()

    new_id = minted.headers["x-request-id"]
    assert given.headers["x-request-id"] == "trace-42" and new_id != "bad id with spaces" and len(new_id) == 32
    assert [r["headers"]["x-request-id"] for r in backend.received] == ["trace-42", new_id]
    lines = [json.loads(line) for line in log_text.splitlines() if line.strip()]
    assert {"ts", "level", "logger", "message"} <= set(lines[0])
    by_id = Counter(entry.get("request_id") for entry in lines if entry["message"].startswith("request "))
    assert by_id == {"trace-42": 1, new_id: 1}
    assert SECRET_WORDS not in log_text


def test_serve_refuses_an_unknown_log_format(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("instances:\n  - url: http://127.0.0.1:9\n")
    bad = subprocess.run([sys.executable, "-m", "router", "serve", "--config", str(path), "--log-format", "xml"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--log-format" in bad.stderr
