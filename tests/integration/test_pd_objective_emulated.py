"""Isolation by a TBT objective on the live path: the router built from config routes PD
requests through emulated engines with the same policy object the replay measures."""

from contextlib import ExitStack

import httpx

from router.config.model import load_config
from router.gateway.app import create_app
from router.scheduling.routes import PairRoutes
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from servers import serve_app

SYSTEM = "You are the support assistant of a large logistics company. Answer precisely. " * 40  # ~800 tokens


def test_the_live_router_routes_pd_requests_with_the_objective_on_its_own_clock():
    with ExitStack() as stack:
        base = EmulatorConfig(model="m", time_scale=0.01)
        p = stack.enter_context(start_in_thread(base.replace(role="prefill", engine_id="p0")))
        d = stack.enter_context(start_in_thread(base.replace(role="decode", engine_id="d0")))
        config = load_config(overrides={
            "instances": [{"url": p.url, "name": "p0", "role": "prefill", "model": "m"},
                          {"url": d.url, "name": "d0", "role": "decode", "model": "m"}],
            "health": {"interval_s": 60}, "policy": {"seed": 1},
            "pd": {"handoff": {"link_aware": True, "isolation": "objective", "tbt_objective": {"window_s": 5}}},
        })
        app = create_app(config)
        url = stack.enter_context(serve_app(app))
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": SYSTEM},
                                                            {"role": "user", "content": "Where is parcel 1?"}]}
        for _ in range(2):
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
        assert httpx.get(f"{d.url}/emulator/stats").json()["tokens"]["transferred_in"] > 700  # the first went P -> D
        routes = app.state.service.policy.inner.routes
        assert isinstance(routes, PairRoutes) and routes.stalls is not None
        # an idle decode instance stalls nobody: nothing was spent, and the window reads the monotonic clock
        assert routes.stalls.ledger.spent() == 0
