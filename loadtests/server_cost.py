"""The same router app under two ASGI servers: uvicorn (httptools + uvloop, what `pd-router serve`
runs) and granian (Rust HTTP, ASGI interface, uvloop); router CPU per request, pinned as in
cpu_per_request.py (router on core 0, load and backend on core 1).

granian serves the app through ``router.gateway.serve:app_factory`` (the ``--workers`` entry
point, one worker here), so nothing in the product changes to try it.

    pip install granian   # or -e '.[bench]'
    python loadtests/server_cost.py [--concurrency 16 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import yaml  # noqa: E402

from loadtests.cpu_per_request import LOAD_CORE, ROUTER_CORE, measure, pin, render  # noqa: E402
from loadtests.overhead import pd_router, zero_backend  # noqa: E402
from router.tools.process import free_port  # noqa: E402


@contextlib.contextmanager
def granian(backends: list[str]):  # type: ignore[no-untyped-def]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump({"instances": [{"url": u, "name": f"z{i}"} for i, u in enumerate(backends)]}, fh)
    port = free_port("127.0.0.1")
    env = {**os.environ, "PDR_SERVE_CONFIG": fh.name, "PDR_SERVE_WORKERS": "1"}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "granian", "--interface", "asgi", "--factory", "--host", "127.0.0.1",
                             "--port", str(port), "--loop", "uvloop", "--log-level", "warning",
                             "router.gateway.serve:app_factory"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(150):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/ready", trust_env=False).status_code == 200:
                    break
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"granian exited: {log.read()[-800:].decode(errors='replace')}")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        os.unlink(fh.name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    p.add_argument("--modes", nargs="+", default=["plain", "stream"], choices=["plain", "stream"])
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    os.sched_setaffinity(0, {LOAD_CORE})
    with contextlib.ExitStack() as stack:
        backends, _ = stack.enter_context(zero_backend(2))
        uv = stack.enter_context(pd_router(backends))
        targets = {"uvicorn (httptools, uvloop)": (uv.url, uv.process.pid),
                   "granian (asgi, uvloop)": stack.enter_context(granian(backends))}
        for _, pid in targets.values():
            pin(pid, ROUTER_CORE)
        cells = measure(targets, {}, args)
    print(render(cells, list(targets), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
