"""router/tools/realvllm.py without an engine: where each engine's compute threads go."""

from __future__ import annotations

import os

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
