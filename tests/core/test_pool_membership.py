"""The instance pool changes at run time: sources sync their whole view, ids never collide."""

from router.config.model import InstanceConfig, load_config
from router.core.instances import InstancePool


def inst(name, url, **kw):
    return InstanceConfig(name=name, url=url, **kw)


def test_sync_adds_updates_and_removes_one_source_only():
    pool = InstancePool(load_config(overrides={"instances": [{"name": "s", "url": "http://10.0.0.1:8000"}]}))
    change = pool.sync("kubernetes", [inst("p0", "http://10.0.1.1:8000", role="prefill"), inst("d0", "http://10.0.1.2:8000")])
    assert [i.id for i in change.added] == ["p0", "d0"] and not change.removed
    assert not pool.get("p0").healthy  # a newcomer takes traffic only after a check passes
    assert pool.disaggregated
    change = pool.sync("kubernetes", [inst("d0", "http://10.0.1.2:8000", cache_tokens=1000)])
    assert [i.id for i in change.removed] == ["p0"] and [i.id for i in change.updated] == ["d0"]
    assert pool.get("d0").candidate.cache_tokens == 1000 and not pool.disaggregated
    assert sorted(i.id for i in pool) == ["d0", "s"]  # the static instance is another source's
    # the same name at another address is another engine (another cache): removed, then added
    change = pool.sync("kubernetes", [inst("d0", "http://10.0.9.9:8000")])
    assert [i.url for i in change.removed] == ["http://10.0.1.2:8000"] and [i.url for i in change.added] == ["http://10.0.9.9:8000"]


def test_an_id_held_by_another_source_is_refused():
    pool = InstancePool(load_config(overrides={"instances": [{"name": "a", "url": "http://10.0.0.1:8000"}]}))
    change = pool.sync("dns", [inst("a", "http://10.9.9.9:8000"), inst("b", "http://10.0.0.2:8000"),
                               inst("b", "http://10.0.0.3:8000")])
    assert change.refused == {"a": "id already used by a static instance", "b": "duplicate id"}
    assert pool.get("b").url == "http://10.0.0.2:8000"
    assert pool.get("a").url == "http://10.0.0.1:8000" and pool.get("a").source == "static"


def test_removed_instances_stay_addressable_for_requests_in_flight_but_are_never_chosen():
    pool = InstancePool(load_config())
    pool.sync("dns", [inst("x", "http://10.0.0.1:8000")], healthy=True)
    assert [i.id for i in pool.healthy(["mixed"])] == ["x"] and pool.any_healthy()
    pool.sync("dns", [])
    assert pool.get("x").url == "http://10.0.0.1:8000"  # a request routed there before can finish its bookkeeping
    pool.record_failure("x")
    pool.record_success("x")
    assert "x" not in pool and pool.healthy(["mixed"]) == [] and not pool.any_healthy()


def test_a_draining_instance_takes_no_new_request():
    pool = InstancePool(load_config(overrides={"instances": [{"name": "a", "url": "http://10.0.0.1:8000"},
                                                             {"name": "b", "url": "http://10.0.0.2:8000"}]}))
    pool.set_draining("a", True)
    assert [i.id for i in pool.healthy(["mixed"])] == ["b"]
    pool.set_draining("b", True)
    assert not pool.any_healthy()
    pool.set_draining("a", False)
    assert [i.id for i in pool.healthy(["mixed"])] == ["a"]
