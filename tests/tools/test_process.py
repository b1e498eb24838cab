"""wait_ready / stop_process on real child processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.tools.emulator import EmulatorConfig
from router.tools.emulator.launch import spawn_emulator
from router.tools.process import (
    PortTaken,
    bind_socket,
    read_tail,
    retry_port_race,
    startup_error,
    stop_process,
    wait_ready,
)


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


def test_startup_errors_say_when_the_port_was_taken() -> None:
    taken = startup_error("router", "exited with 3", "ERROR: [Errno 98] ... address already in use\n")
    other = startup_error("router", "exited with 1", "ConfigError: no instances")
    assert isinstance(taken, PortTaken) and str(taken).startswith("router exited with 3:\nERROR")
    assert type(other) is RuntimeError and "no instances" in str(other)


def test_retry_port_race_starts_again_only_after_a_lost_race() -> None:
    attempts: list[int] = []

    def start() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise PortTaken("taken")
        return "up"

    assert retry_port_race(start) == "up" and len(attempts) == 3

    def always_taken() -> str:
        attempts.append(1)
        raise PortTaken("taken")

    attempts.clear()
    with pytest.raises(PortTaken):
        retry_port_race(always_taken, attempts=2)
    assert len(attempts) == 2

    def broken() -> str:
        attempts.append(1)
        raise RuntimeError("config error")

    attempts.clear()
    with pytest.raises(RuntimeError, match="config error"):
        retry_port_race(broken)
    assert len(attempts) == 1  # anything but a lost port race is final


def test_an_emulator_on_a_port_in_use_fails_with_port_taken() -> None:
    with bind_socket("127.0.0.1", 0) as sock:
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(PortTaken, match="(?i)address already in use"):
            spawn_emulator(EmulatorConfig(time_scale=0.01), host="127.0.0.1", port=port)
