"""Start emulators: in a thread, in the current event loop, or as a process.

Why three ways: tests want cheap in-process servers (a thread, or the test's
own loop); the demo wants real parallelism on several cores (subprocesses).
All bind the socket *before* building the app so that port 0 works and the
engine knows the port it advertises to PD peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.faults import install_log_filter
from router.tools.emulator.flags import config_to_argv
from router.tools.emulator.runtime import EmulatorRuntime
from router.tools.emulator.server import build_app
from router.tools.process import (
    bind_socket,
    free_port,
    read_tail,
    retry_port_race,
    startup_error,
    stop_process,
    wait_ready,
)


@dataclass
class EmulatorHandle:
    """A running in-process emulator; ``stop()`` shuts it down."""

    url: str
    host: str
    port: int
    config: EmulatorConfig
    engine_id: str
    bootstrap_port: int | None
    _stop: Callable[[], None] = field(repr=False, default=lambda: None)

    def stop(self) -> None:
        self._stop()

    def __enter__(self) -> EmulatorHandle:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def uvicorn_config(app: Any, log_level: str = "warning", event_loop: bool = False
                   ) -> uvicorn.Config:
    """Lean uvicorn settings: no access log, short graceful shutdown."""
    try:
        import httptools  # noqa: F401
        http = "httptools"
    except ImportError:  # pragma: no cover
        http = "h11"
    loop = "none"
    if event_loop:
        try:
            import uvloop  # noqa: F401
            loop = "uvloop"
        except ImportError:  # pragma: no cover
            loop = "asyncio"
    return uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on",
                          http=http, ws="none", loop=loop, timeout_graceful_shutdown=1,
                          timeout_keep_alive=30)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


def _prepare(config: EmulatorConfig, host: str | None, port: int | None
             ) -> tuple[socket.socket, EmulatorConfig, uvicorn.Server, EmulatorRuntime]:
    host = host or config.host
    sock = bind_socket(host, config.port if port is None else port)
    config = config.replace(host=host, port=int(sock.getsockname()[1]))
    app = build_app(config)
    install_log_filter()
    return sock, config, uvicorn.Server(uvicorn_config(app)), app.state.runtime


def _handle(config: EmulatorConfig, runtime: EmulatorRuntime,
            stop: Callable[[], None]) -> EmulatorHandle:
    return EmulatorHandle(url=f"http://{config.public_host}:{config.port}",
                          host=config.host, port=config.port, config=config,
                          engine_id=runtime.engine_id, bootstrap_port=runtime.bootstrap_port,
                          _stop=stop)


def start_in_thread(config: EmulatorConfig, host: str | None = None, port: int | None = 0,
                    ready_timeout: float = 15.0) -> EmulatorHandle:
    """Serve ``config`` from a daemon thread with its own event loop."""
    sock, config, server, runtime = _prepare(config, host, port)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with asyncio.Runner(loop_factory=_new_loop) as runner:
                runner.run(server.serve(sockets=[sock]))
        except BaseException as exc:  # surfaced to the starting thread
            errors.append(exc)
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"emulator-{config.port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"emulator on port {config.port} failed to start: {errors}")
        time.sleep(0.005)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5)

    return _handle(config, runtime, stop)


@asynccontextmanager
async def serve_emulator(config: EmulatorConfig, host: str | None = None,
                         port: int | None = 0) -> AsyncIterator[EmulatorHandle]:
    """Serve ``config`` inside the running event loop for the ``async with`` body."""
    sock, config, server, runtime = _prepare(config, host, port)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("emulator exited during startup")
            await asyncio.sleep(0.005)
        yield _handle(config, runtime, lambda: setattr(server, "should_exit", True))
    finally:
        server.should_exit = True
        await task
        sock.close()


@dataclass
class EmulatorProcess:
    """An emulator running as ``python -m router.tools.emulator``."""

    process: subprocess.Popen[bytes]
    url: str
    host: str
    port: int
    bootstrap_port: int
    log_path: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, limit: int = 4000) -> str:
        return read_tail(self.log_path, limit)

    def stop(self, timeout: float = 5.0) -> int:
        """Terminate (then kill) the process; returns its exit code."""
        code = stop_process(self.process, timeout)
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)
        return code

    def __enter__(self) -> EmulatorProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def spawn_emulator(config: EmulatorConfig, host: str | None = None,
                   port: int | None = None, ready_timeout: float = 30.0,
                   extra_args: list[str] | None = None) -> EmulatorProcess:
    """Start a subprocess and wait until its /health answers (any status).

    Ports not given (``port``, ``config.bootstrap_port``) are picked free, again if the
    engine lost the race for them.
    """
    return retry_port_race(lambda: _spawn(config, host or config.host, port, ready_timeout,
                                          extra_args or []))


def _spawn(config: EmulatorConfig, host: str, port: int | None, ready_timeout: float,
           extra_args: list[str]) -> EmulatorProcess:
    port = port or free_port(host)
    bootstrap = config.bootstrap_port or free_port(host)
    config = config.replace(host=host, port=port, bootstrap_port=bootstrap)
    fd, log_path = tempfile.mkstemp(prefix=f"emulator-{port}-", suffix=".log")
    argv = [sys.executable, "-m", "router.tools.emulator", *config_to_argv(config), *extra_args]
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    handle = EmulatorProcess(process=process, url=f"http://{config.public_host}:{port}",
                             host=host, port=port, bootstrap_port=bootstrap,
                             log_path=log_path)
    with httpx.Client(trust_env=False, timeout=1.0) as client:

        def answers() -> bool:  # any status: a 503 from an unhealthy-by-fault engine is up
            try:
                client.get(handle.url + "/health")
            except httpx.HTTPError:
                return False
            return True

        try:
            wait_ready(answers, process, ready_timeout,
                       lambda why: startup_error("emulator", why, handle.log_tail()))
        except RuntimeError:
            handle.stop()
            raise
    return handle
