"""Servers the tooling starts on this machine: ports, readiness, log tails, stopping.

Why one module: the emulator launcher, the local router deployments and the benchmarks'
peer routers all start a subprocess that logs to a file, wait until it answers, and must
fail with the end of that log when it exits or never gets ready. Doing that once keeps the
failure messages (and the cleanup) the same everywhere.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class PortTaken(RuntimeError):
    """A child could not bind the port ``free_port`` had picked: something took it in between."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket, inheritable by a child process (port 0 = any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for processes that bind it themselves)."""
    with bind_socket(host, 0) as sock:
        return int(sock.getsockname()[1])


def read_tail(path: str, limit: int = 4000) -> str:
    """The end of a process's log file, for error messages ("" if unreadable)."""
    try:
        with open(path, "rb") as fh:
            return fh.read()[-limit:].decode("utf-8", "replace")
    except OSError:
        return ""


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """Terminate, give it ``timeout`` seconds to finish cleanly, then kill; the exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    return int(process.returncode)


def wait_ready(check: Callable[[], bool], process: subprocess.Popen[bytes], timeout: float,
               error: Callable[[str], Exception], interval: float = 0.05) -> None:
    """Poll ``check`` until it returns True.

    Raises ``error(why)`` as soon as ``process`` has exited (``why`` = "exited with CODE")
    or once ``timeout`` seconds have passed ("not ready after Ns"); ``error`` builds the
    exception, typically with the process's log tail, which is read only then. The process
    is checked before each probe, so a port someone else answers on is not taken for ours
    after our process died.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise error(f"exited with {process.returncode}")
        if check():
            return
        if time.monotonic() > deadline:
            raise error(f"not ready after {timeout:g}s")
        time.sleep(interval)


def startup_error(what: str, why: str, log_tail: str) -> RuntimeError:
    """The error for a child (``what``) that never got ready: PortTaken when its log says
    it lost ``free_port``'s race, a plain RuntimeError otherwise; both carry the log tail."""
    kind = PortTaken if "address already in use" in log_tail.lower() else RuntimeError
    return kind(f"{what} {why}:\n{log_tail}")


def retry_port_race(start: Callable[[], T], attempts: int = 3) -> T:
    """``start()``, again while it raises PortTaken (it must pick fresh free ports each time).

    ``free_port`` can only name a port that was free a moment ago; on a busy machine an
    outgoing connection sometimes takes it before the child binds it.
    """
    for _ in range(attempts - 1):
        try:
            return start()
        except PortTaken:
            continue
    return start()
