"""Issue 10, required load test: a headless Locust run (30 s by default: PDR_LOCUST_SECONDS) at
steady load through the router, with one of three engines fault-injected (streams dropped
after 5 tokens, 10% of requests answered 503). The client sees 0 failures: the 503s are
retried elsewhere, broken streams continued, and the faulty engine ejected.

This is the slowest test of the suite (~35 s); it needs locust (the ``bench`` extra, also in
``test``)."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from faults.conftest import router  # type: ignore[import-not-found]
from router.tools.emulator import FaultConfig

# Not imported here: locust monkeypatches the process with gevent on import. It runs in its own.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs locust")
ROOT = Path(__file__).resolve().parents[2]


def test_locust_at_steady_load_with_one_faulty_engine_sees_no_failure(emulators, tmp_path):
    seconds = int(os.environ.get("PDR_LOCUST_SECONDS", "30"))
    faulty = emulators(faults=FaultConfig(die_after_tokens=5, error_rate=0.1))
    engines = [faulty, emulators(), emulators()]
    instances = [{"url": e.url, "name": f"e{i}"} for i, e in enumerate(engines)]
    with router(instances) as (url, app):
        env = {**os.environ, "PDR_LT_MODEL": "m", "PDR_LT_GROUPS": "4", "PDR_LT_SYSTEM_PROMPT_LEN": "200",
               "PDR_LT_QUESTION_LEN": "20", "PDR_LT_OUTPUT_LEN": "24", "PDR_LT_IGNORE_EOS": "0"}
        run = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"), "--headless",
             "-u", "12", "-r", "12", "-t", f"{seconds}s", "--host", url, "--csv", str(tmp_path / "run"), "--only-summary"],
            env=env, capture_output=True, text=True, timeout=seconds + 120)
        rows = list(csv.DictReader((tmp_path / "run_stats.csv").open()))
        total = next(r for r in rows if r["Name"] == "Aggregated")
        print(f"locust: {total['Request Count']} requests, {total['Failure Count']} failures, "
              f"median {total['Median Response Time']} ms")
        assert int(total["Request Count"]) > 100, run.stderr[-3000:]
        assert int(total["Failure Count"]) == 0, run.stderr[-3000:]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pd_router_outlier_ejections_total{engine="e0"}' in metrics  # the faulty engine was hit, and ejected
        http = httpx.get(f"{faulty.url}/emulator/stats").json()["http"]
        print(f"faulty engine: {http['injected_drops']} streams dropped, {http['injected_errors']} answered 503")
        assert http["injected_drops"] + http["injected_errors"] > 0
