"""What /metrics adds beside the router's own metrics, and prometheus_client's multiprocess mode.

``serve --workers N`` runs N processes behind one port; a scrape reaches one of them. With a
per-process registry each scrape would show whichever worker answered, so counters would jump
between scrapes. In multiprocess mode every worker writes its samples to memory-mapped files in
one directory (``PROMETHEUS_MULTIPROC_DIR``) and the answering worker reads and sums them all.
prometheus_client picks that mode when it is first imported, from the environment, so ``serve``
prepares the directory before it starts the workers; a stale directory would resurrect the
samples of a previous run, so it is emptied first.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from pathlib import Path

from prometheus_client import values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.process_collector import ProcessCollector

import router

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_PID_IN_NAME = re.compile(r"_(\d+)\.db$")


def multiprocess_dir() -> str | None:
    """The directory this process writes its samples to, or None outside multiprocess mode.

    Both conditions matter: the value class is fixed when prometheus_client is imported, so the
    variable set later (or unset later) does not change where samples go."""
    path = os.environ.get(MULTIPROC_ENV)
    if path and values.ValueClass is not values.MutexValue:
        return path
    return None


def prepare_multiprocess_dir(environ: MutableMapping[str, str] = os.environ) -> str:
    """Make ``PROMETHEUS_MULTIPROC_DIR`` an empty directory before any worker starts.

    Keeps a directory the operator chose (emptied of the ``*.db`` files a previous run left:
    point it at a directory of its own), else creates a temporary one, removed at exit."""
    chosen = environ.get(MULTIPROC_ENV)
    if chosen:
        path = Path(chosen)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
        return str(path)
    created = tempfile.mkdtemp(prefix="pd-router-metrics-")
    atexit.register(shutil.rmtree, created, ignore_errors=True)
    environ[MULTIPROC_ENV] = created
    return created


class BuildInfo:
    """``pd_router_build_info{version, python}`` = 1: which build answers, for joins and upgrades."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("pd_router_build_info", "Version of the running router (always 1)",
                                   labels=["version", "python"])
        family.add_metric([router.__version__, ".".join(map(str, sys.version_info[:3]))], 1)
        yield family


# How the process metrics of several workers combine into the one router they form.
_COMBINE: dict[str, Callable[[Iterable[float]], float]] = {
    "process_start_time_seconds": min,
    "process_max_fds": min,
}


class WorkerProcesses:
    """Process metrics (CPU, memory, file descriptors) summed over the live worker processes.

    prometheus_client's ProcessCollector reports the process that answers the scrape only. The
    workers are found by the pid in the names of the sample files they write; a worker that is
    gone has its live gauges (in-flight requests) removed, as prometheus_client requires."""

    def __init__(self, path: str, proc: str = "/proc") -> None:
        self._path = Path(path)
        self._proc = proc

    def _pids(self) -> list[int]:
        pids = {int(m.group(1)) for f in self._path.glob("*.db") if (m := _PID_IN_NAME.search(f.name))}
        pids.add(os.getpid())
        live = []
        for pid in sorted(pids):
            if os.path.exists(os.path.join(self._proc, str(pid))):
                live.append(pid)
            else:
                mark_process_dead(pid, str(self._path))  # type: ignore[no-untyped-call]  # untyped in prometheus_client
        return live

    def collect(self) -> Iterator[Metric]:
        by_name: dict[str, list[Metric]] = {}
        for pid in self._pids():
            collector = ProcessCollector(pid=lambda p=pid: p, proc=self._proc, registry=None)  # type: ignore[misc]
            for family in collector.collect():
                by_name.setdefault(family.name, []).append(family)
        for name, families in by_name.items():
            combine = _COMBINE.get(name, sum)
            merged = Metric(name, families[0].documentation, families[0].type)
            sample_name = families[0].samples[0].name
            merged.add_sample(sample_name, {}, combine(f.samples[0].value for f in families))
            yield merged
