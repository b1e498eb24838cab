"""Issue 10, finding 12: start-up errors end in exit 2 with a message, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from servers import free_port


@pytest.mark.parametrize("env, says", [
    ({"PD_ROUTER_INSTANCES": "not json"}, "environment"),
    ({"PD_ROUTER_STATE__BACKEND": "redis", "PD_ROUTER_STATE__REDIS_URL": "redis://host:notaport/0"}, "state.redis_url"),
    ({"PD_ROUTER_STATE__REDIS_URL": "http://127.0.0.1:6379"}, "state.redis_url"),
    ({"PD_ROUTER_STATE__REDIS_URL": "redis://127.0.0.1:6379/zero"}, "state.redis_url"),
])
def test_bad_start_up_settings_exit_2_with_a_message(env, says):
    run = subprocess.run([sys.executable, "-m", "router.cli", "serve", "--port", str(free_port())],
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert says in run.stderr and "Traceback" not in run.stderr
