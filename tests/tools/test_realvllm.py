"""router/tools/realvllm.py without an engine: where each engine's compute threads go, and a
start that lost a port to another process started again on fresh ports."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from router.tools import realvllm


def test_each_engine_gets_a_core_of_its_own_while_there_are_enough() -> None:
    assert realvllm.engine_cores(2, [0, 1]) == [0, 1]
    assert realvllm.engine_cores(2, [3, 5, 7]) == [3, 5]  # the cores this process may use, not 0..n-1
    assert realvllm.engine_cores(3, [0, 1]) == [None, None, None]  # too few: vLLM's own choice for all
    assert realvllm.engine_cores(1, [0, 1]) == [None]  # one engine: nothing to keep apart
    assert all(c is None or isinstance(c, int) for c in realvllm.engine_cores(2))  # this machine's affinity


def test_a_spec_that_binds_its_threads_itself_keeps_its_binding() -> None:
    own = realvllm.VllmSpec(port=1, kv_events_port=2, extra_env=((realvllm.OMP_BIND_ENV, "nobind"),))
    assert realvllm.engine_env(own, core=1)[realvllm.OMP_BIND_ENV] == "nobind"
    plain = realvllm.VllmSpec(port=1, kv_events_port=2)
    assert realvllm.engine_env(plain, core=1)[realvllm.OMP_BIND_ENV] == "1"
    env = realvllm.engine_env(plain)
    assert env.get(realvllm.OMP_BIND_ENV) == os.environ.get(realvllm.OMP_BIND_ENV)  # no core: left alone
    assert env["HF_HUB_OFFLINE"] == "1" and env["PYTHONPATH"] == ""


FAKE_ENGINE = '''#!{python}
"""Stands in for `python -m vllm.entrypoints.openai.api_server ... --port N`: the first start
loses a port as vLLM does when another process took it; later starts answer /health."""
import http.server, pathlib, sys
starts = pathlib.Path({starts!r})
starts.write_text(starts.read_text() + "x" if starts.exists() else "x")
if {fail_first} and len(starts.read_text()) == 1:
    print({message!r}, flush=True)
    sys.exit(1)
port = int(sys.argv[sys.argv.index("--port") + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def _fake(tmp_path, message: str, fail_first: bool = True):
    starts = tmp_path / "starts"
    script = tmp_path / "fake-python"
    script.write_text(FAKE_ENGINE.format(python=sys.executable, starts=str(starts), fail_first=fail_first,
                                         message=message))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), starts


def test_an_engine_that_lost_a_port_before_binding_it_starts_again_on_fresh_ports(tmp_path) -> None:
    python, starts = _fake(tmp_path, "zmq.error.ZMQError: Address already in use (addr='tcp://*:42077')")
    spec = realvllm.VllmSpec(port=realvllm.free_port(), kv_events_port=realvllm.free_port(), kv_replay_port=realvllm.free_port())
    engines = realvllm.start_all(python, tmp_path, [spec], tmp_path, timeout_s=30)
    try:
        assert starts.read_text() == "xx"  # failed once, started again
        (engine,) = engines
        assert engine.process.poll() is None and engine.spec.port != spec.port
        assert engine.spec.kv_events_port != spec.kv_events_port and engine.spec.kv_replay_port is not None
    finally:
        for engine in engines:
            engine.stop()


def test_any_other_start_failure_is_raised_at_once(tmp_path) -> None:
    python, starts = _fake(tmp_path, "RuntimeError: Engine core initialization failed")
    spec = realvllm.VllmSpec(port=realvllm.free_port(), kv_events_port=realvllm.free_port())
    with pytest.raises(RuntimeError, match="exited"):
        realvllm.start_all(python, tmp_path, [spec], tmp_path, timeout_s=30)
    assert starts.read_text() == "x"  # no second start
