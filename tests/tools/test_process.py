"""wait_ready / stop_process on real child processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.tools.process import read_tail, stop_process, wait_ready


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    stop_process(proc, timeout=5)


def _fail(why: str) -> Exception:
    return LookupError(why)


def test_returns_once_the_check_passes(sleeper: subprocess.Popen[bytes]) -> None:
    calls = []

    def check() -> bool:
        calls.append(1)
        return len(calls) == 3

    wait_ready(check, sleeper, timeout=10, error=_fail, interval=0.01)
    assert len(calls) == 3


def test_a_process_that_exits_fails_with_its_code_without_waiting_for_the_timeout() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    started = time.monotonic()
    with pytest.raises(LookupError, match="exited with 3"):
        wait_ready(lambda: False, proc, timeout=30, error=_fail, interval=0.01)
    assert time.monotonic() - started < 20


def test_a_process_that_exited_is_not_ready_even_if_the_check_passes() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    with pytest.raises(LookupError, match="exited with 0"):
        wait_ready(lambda: True, proc, timeout=5, error=_fail)


def test_a_check_that_never_passes_times_out(sleeper: subprocess.Popen[bytes]) -> None:
    with pytest.raises(LookupError, match=r"not ready after 0.2s"):
        wait_ready(lambda: False, sleeper, timeout=0.2, error=_fail, interval=0.01)
    assert sleeper.poll() is None  # waiting does not stop the process; the caller decides


def test_stop_process_terminates_and_returns_the_code(sleeper: subprocess.Popen[bytes]) -> None:
    assert stop_process(sleeper, timeout=5) != 0
    assert sleeper.poll() is not None


def test_read_tail_keeps_the_end_and_tolerates_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"a" * 100 + b"the end")
    assert read_tail(str(log), 7) == "the end"
    assert read_tail(str(tmp_path / "missing.log")) == ""
