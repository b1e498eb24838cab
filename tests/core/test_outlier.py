"""Passive outlier ejection: growing ejection time, a cap on the ejected share, half-open
probing, and active and passive signals kept apart (issue 10, findings 3 and 4)."""

import time

from router.config.model import load_config
from router.core.instances import InstancePool


def pool(n=3, **health):
    config = load_config(overrides={"instances": [{"url": f"http://127.0.0.1:{9000 + i}", "name": f"i{i}"} for i in range(n)],
                                    "health": {"outlier_failures": 2, "outlier_base_ejection_s": 0.2, **health}})
    return InstancePool(config)


def routable(p):
    return [i.id for i in p.healthy(["mixed"])]


def test_consecutive_failures_eject_and_a_success_in_between_does_not():
    p = pool()
    p.passive_failure("i0")
    p.passive_success("i0")
    p.passive_failure("i0")
    assert "i0" in routable(p)
    assert p.passive_failure("i0")
    assert "i0" not in routable(p) and p.get("i0").healthy


def test_ejection_time_grows_and_half_open_failure_ejects_again_at_once():
    p = pool()
    p.passive_failure("i0"), p.passive_failure("i0")
    first = p.get("i0").outlier.ejected_until - time.monotonic()
    time.sleep(0.25)
    assert "i0" in routable(p)  # half-open: it gets a request again
    assert p.passive_failure("i0")  # one failure is enough now
    second = p.get("i0").outlier.ejected_until - time.monotonic()
    assert second > first * 1.5
    time.sleep(second + 0.05)
    p.passive_success("i0")  # back for good: the next ejection starts from the base time again
    assert p.get("i0").outlier.ejections == 0


def test_the_ejected_share_is_capped():
    p = pool(3, outlier_max_ejected_percent=50)
    for inst in ("i0", "i1", "i2"):
        p.passive_failure(inst, fatal=True)
    assert routable(p) == ["i1", "i2"]  # a second ejection would take 2 of 3 out


def test_active_and_passive_signals_never_reset_each_other():
    p = pool(1, failures_to_unhealthy=2)
    p.record_failure("i0")
    p.passive_success("i0")  # a proxied success used to reset the check count
    p.record_failure("i0")
    assert not p.get("i0").healthy
    q = pool(2)
    q.passive_failure("i0")
    q.record_success("i0")  # a passing check says nothing about what traffic saw
    q.passive_failure("i0")
    assert "i0" not in routable(q)
