"""The plugin registry: decorator marks, module scans, and the entry-point group for real
(a distribution installed into a temporary sys.path entry)."""

import types

import pytest

from plugin_dist import PLUGIN_MODULE, install
from router.scheduling.registry import ENTRY_POINT_GROUP, NoParams, Params, PluginError, Registry, marked, plugin

def test_marking_registers_nothing_until_a_registry_scans_the_module():
    module = types.ModuleType("scratch")

    @plugin("filter", "nothing", NoParams)
    def nothing(params, ctx):
        """Keeps all."""

    module.nothing = nothing
    assert marked(nothing).name == "nothing" and marked(len) is None
    registry = Registry()
    assert registry.names("filter") == []
    assert registry.scan(module) == 1
    assert registry.names("filter") == ["nothing"] and registry.get("filter", "nothing").summary == "Keeps all."
    with pytest.raises(KeyError, match=r"unknown scorer 'nothing'; known: \(none\)"):
        registry.get("scorer", "nothing")


def test_a_name_registered_twice_is_an_error_naming_both_origins():
    first, second = types.ModuleType("first"), types.ModuleType("second")
    first.f = plugin("scorer", "twin")(lambda params, ctx: None)
    second.f = plugin("scorer", "twin")(lambda params, ctx: None)
    registry = Registry()
    registry.scan(first)
    registry.scan(first)  # the same factory again (e.g. imported into a second module) is no clash
    with pytest.raises(PluginError, match="scorer plugin 'twin' from second clashes with the one from first"):
        registry.scan(second)


def test_bad_kinds_and_names_are_refused_at_decoration():
    with pytest.raises(ValueError, match="unknown plugin kind"):
        plugin("sorter", "x")
    with pytest.raises(ValueError, match="must be letters"):
        plugin("scorer", "has space")


def test_entry_point_naming_a_module_registers_all_its_plugins(tmp_path, monkeypatch):
    eps = install(tmp_path, monkeypatch, {"acme": "acme_plugins"}, {"acme_plugins": PLUGIN_MODULE})
    registry = Registry()
    registry.load_entry_points(eps)
    assert registry.names("scorer") == ["reverse_index"] and registry.names("preset") == ["last_one"]
    info = registry.get("scorer", "reverse_index")
    assert "entry point 'acme'" in info.origin and "acme-router-plugins 1.0" in info.origin
    assert info.factory(info.params.model_validate({"offset": 2}), None).score(None, [1, 2]) == [2.0, 3.0]


def test_entry_point_naming_one_factory(tmp_path, monkeypatch):
    eps = install(tmp_path, monkeypatch, {"one": "acme_one:reverse_index"}, {"acme_one": PLUGIN_MODULE})
    registry = Registry()
    registry.load_entry_points(eps)
    assert registry.names("scorer") == ["reverse_index"] and registry.names("preset") == []


@pytest.mark.parametrize(
    "value, source, expected",
    [
        ("acme_broken", "import not_a_module_anywhere\n", "cannot load plugin entry point 'bad' = 'acme_broken'.*ModuleNotFoundError"),
        ("acme_broken:missing", "x = 1\n", "cannot load plugin entry point 'bad'.*AttributeError"),
        ("acme_broken:helper", "def helper(): pass\n", "neither a @plugin factory nor a module of them"),
        ("acme_broken", "x = 1\n", "module acme_broken defines no @plugin factory"),
    ],
)
def test_a_broken_entry_point_is_an_error_naming_it(tmp_path, monkeypatch, value, source, expected):
    eps = install(tmp_path, monkeypatch, {"bad": value}, {"acme_broken": source}, dist="acme-broken")
    with pytest.raises(PluginError, match=expected) as info:
        Registry().load_entry_points(eps)
    assert "distribution acme-broken 1.0" in str(info.value) and ENTRY_POINT_GROUP in str(info.value)


def test_params_models_reject_unknown_names():
    class Factor(Params):
        factor: float = 1.0

    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        Factor.model_validate({"facter": 2})
