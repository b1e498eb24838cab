"""Policies declared in config as pipelines of registered plugins, and the presets as such."""

import random

import pytest
import yaml

from plugin_dist import PLUGIN_MODULE, install
from router.cli import main
from router.config.model import ConfigError, PDConfig, PolicyConfig, TTFTWeights, load_config
from router.scheduling import Candidate, RouteRequest, build_policy, check_config
from router.scheduling.build import default_registry
from router.scheduling.cost import colocated_ttft
from router.scheduling.framework import build_views
from router.scheduling.pd import TwoProfilePolicy
from router.scheduling.presets import PRESET_NAMES
from router.scheduling.scorers import TTFTScorer
from router.state.base import Load, Snapshot

CANDS = [Candidate("a", cache_tokens=100_000), Candidate("b", cache_tokens=100_000), Candidate("c", cache_tokens=100_000)]
COMPAT = ("m", "auto", 16, "vllm")
PD_CANDS = [Candidate("p1", role="prefill", compat=COMPAT), Candidate("p2", role="prefill", compat=COMPAT),
            Candidate("d1", role="decode", compat=COMPAT), Candidate("d2", role="decode", compat=COMPAT)]
EXAMPLE = """
policy:
  pipeline:
    filters: [{name: bounded_load, params: {factor: 2.0}}]
    scorers: [{name: prefix, weight: 3}, {name: queue, weight: 2}, {name: kv, weight: 2}]
    picker: {name: max_score, params: {tolerance: 0.05}}
"""


def req(blocks=10, prompt=640, max_tokens=64):
    return RouteRequest("r", tuple(range(blocks)), prompt, max_tokens, 64)


def snap(matched=None, loads=None, cands=CANDS):
    matched, loads = matched or {}, loads or {}
    return Snapshot({c.id: matched.get(c.id, 0) for c in cands}, {c.id: loads.get(c.id, Load()) for c in cands})


def declared(pd=None, seed=7, **policy):
    return build_policy(PolicyConfig.model_validate(policy), pd, random.Random(seed))


def config_error(**policy):
    with pytest.raises(ConfigError) as info:
        declared(**policy)
    return str(info.value)


def test_the_readme_pipeline_sums_weighted_scores_after_its_filter(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(EXAMPLE)
    config = load_config(path)
    assert config.policy.name == "custom" and config.policy.preset is None
    pol = build_policy(config.policy, rng=random.Random(1))
    loads = {"a": Load(1, 4000, 50_000), "b": Load(1, 0, 0), "c": Load(30, 2000, 0)}
    d = pol.choose(req(), CANDS, snap({"a": 10, "b": 5}, loads))
    assert d.filtered == {"c": "bounded_load"} and d.reason == "score after bounded_load"
    # a: 3*1.0 + 2*0 + 2*0.5 = 4.0; b: 3*0.5 + 2*1 + 2*1 = 5.5 (c dropped: 31 requests > 2x the mean of 11)
    assert d.scores == pytest.approx({"a": 4.0, "b": 5.5}) and d.instance == "b"
    assert d.plugin_scores["a"] == pytest.approx({"prefix": 1.0, "queue": 0.0, "kv": 0.5})
    assert pol.describe()["scorers"][0] == {"name": "prefix", "weight": 3.0, "params": {}}


def test_plugins_may_be_named_by_a_bare_string():
    pol = declared(pipeline={"scorers": ["requests"], "picker": "first_max"})
    assert pol.choose(req(), CANDS, snap(loads={"a": Load(2), "b": Load(1), "c": Load(1)})).instance == "b"


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_is_registered_and_builds_in_both_kinds_of_cluster(name):
    assert set(PRESET_NAMES) <= set(default_registry().names("preset"))
    assert declared(name=name).choose(req(), CANDS, snap()).instance in {"a", "b", "c"}
    d = declared(name=name, pd=PDConfig()).choose(req(), PD_CANDS, snap(cands=PD_CANDS))
    assert d.mode == "disaggregated" and d.instance in {"d1", "d2"}


def test_a_preset_is_the_pipeline_it_names():
    ttft = TTFTWeights()
    same = {"filters": [{"name": "bounded_load", "params": {"factor": ttft.bounded_load_factor, "slack": ttft.bounded_load_slack,
                                                             "keep_tokens": ttft.bounded_load_keep_tokens}},
                        {"name": "cache_room"}],
            "scorers": [{"name": "ttft"}], "picker": {"name": "rendezvous", "params": {"tolerance": ttft.tie_tolerance}}}
    preset, pipeline = declared(name="ttft"), declared(pipeline=same)
    assert preset.describe() == pipeline.describe()
    rng = random.Random(3)
    for _ in range(200):
        s = snap({c.id: rng.randrange(11) for c in CANDS}, {c.id: Load(rng.randrange(6), rng.randrange(20_000)) for c in CANDS})
        a, b = preset.choose(req(), CANDS, s), pipeline.choose(req(), CANDS, s)
        assert (a.instance, a.acceptable, a.reason, a.estimate_s) == (b.instance, b.acceptable, b.reason, b.estimate_s)


def test_profiles_choose_p_then_d_and_explain_both():
    profiles = {"prefill": {"scorers": ["prefix"], "picker": "first_max"},
                "decode": {"scorers": ["requests"], "picker": "first_max"}}
    pol = declared(pd=PDConfig(), profiles=profiles)
    assert isinstance(pol, TwoProfilePolicy) and pol.name == "custom"
    d = pol.choose(req(), PD_CANDS, snap({"p2": 10}, {"d1": Load(3)}, cands=PD_CANDS))
    assert (d.prefill, d.instance, d.mode, d.reason) == ("p2", "d2", "disaggregated", "independent:score")
    assert d.profiles["prefill"].plugin_scores["p2"] == {"prefix": 1.0}
    assert d.profiles["decode"].scores == pytest.approx({"d1": 0.25, "d2": 1.0})
    # a cluster without a prefill pool: the decode profile alone
    alone = declared(profiles=profiles)
    assert alone.choose(req(), CANDS, snap(loads={"a": Load(1)})).instance == "b"


def test_a_joint_pd_pipeline_scores_pairs_with_any_scorer():
    pol = declared(pd=PDConfig(), pipeline={"scorers": [{"name": "pd_ttft"}, {"name": "prefix", "weight": 0.5}]})
    d = pol.choose(req(128, 8192), PD_CANDS, snap({"p1": 128}, cands=PD_CANDS))
    assert d.prefill == "p1" and set(d.plugin_scores[d.key]) == {"pd_ttft", "prefix"}
    assert d.plugin_scores[d.key]["prefix"] == 1.0 and d.estimate_s == d.terms[d.key]["ttft_s"]
    assert set(d.scores) == {"d1<-p1", "d1<-p2", "d2<-p1", "d2<-p2"}


def test_load_blind_pickers_make_a_policy_not_revisable():
    assert not declared(name="round_robin").revisable and not declared(name="random").revisable
    assert declared(name="ttft").revisable and declared(pipeline={"picker": "first_max"}).revisable


def _priced_cases(seed, n):
    """(weights, request, candidates, snapshot): prefill-only and mixed engines, declared and
    default rates, measured decode steps or the configured one, queues with a head under way, chunked prefill or not, matches deeper than
    the prompt, confidences below 1, caches some of which must wait for KV room."""
    rng = random.Random(seed)
    for _ in range(n):
        weights = TTFTWeights(attention_s_per_token2=rng.choice([0.0, 3e-9]), request_overhead_s=0.01,
                              decode_interference_s=0.004, decode_step_s=0.02,
                              prefill_chunk_tokens=rng.choice([0, 512, 2048]))
        cands = [Candidate(f"i{i}", prefill_tokens_per_s=rng.choice([None, 3000.0, 12_345.0]),
                           cache_tokens=rng.choice([500_000, 40_000, 4_000]), role=rng.choice(["mixed", "prefill"]),
                           decode_step_s=rng.choice([None, 0.0123]))
                 for i in range(4)]
        blocks = rng.randrange(0, 300)
        r = RouteRequest("r", tuple(range(blocks)), blocks * 64 + rng.randrange(-63, 64) if blocks else rng.randrange(50),
                         rng.randrange(1, 512), 64)
        loads = {}
        for c in cands:
            load = Load(rng.randrange(40), rng.choice([0, rng.randrange(200_000)]), rng.choice([0, rng.randrange(10**6)]))
            loads[c.id] = load.with_head(rng.random() * 3, rng.randrange(20_000)) if rng.random() < 0.5 else load
        s = Snapshot({c.id: rng.randrange(0, blocks + 3) for c in cands}, loads,  # some match more than the prompt
                     {c.id: rng.choice([1.0, rng.random()]) for c in cands})
        yield weights, r, cands, s


def test_ttft_scorer_inlined_estimate_is_the_cost_model_to_the_bit():
    # exactly equal, not only close: the chosen route's estimate is handed back from estimates()
    for weights, r, cands, s in _priced_cases(11, 600):
        views = build_views(cands, s)
        assert TTFTScorer(weights).estimates(r, views) == [colocated_ttft(r, v, weights).total_s for v in views]


def test_the_decision_estimate_is_the_cost_model_of_the_chosen_route():
    for weights, r, cands, s in _priced_cases(12, 300):
        pol = build_policy(PolicyConfig(ttft=weights), None, random.Random(0))
        d = pol.choose(r, cands, s)
        chosen = next(v for v in build_views(cands, s) if v.id == d.instance)
        assert d.estimate_s == colocated_ttft(r, chosen, weights).total_s
        assert d.estimate_s == d.terms[d.instance]["ttft_s"]


# -- errors: the field, the problem, the known names -------------------------------------------

def test_unknown_plugin_names_the_field_and_the_known_names():
    msg = config_error(pipeline={"scorers": ["prefix", "prefx"]})
    assert "policy.pipeline.scorers.1.name: unknown scorer 'prefx'; known: " in msg
    assert "dynamo_cost, kv, pd_tbt, pd_ttft, prefix, queue, requests, ttft" in msg
    assert "policy.pipeline.picker.name: unknown picker 'best'" in config_error(pipeline={"picker": "best"})


def test_unknown_preset_names_the_field_and_the_presets():
    msg = config_error(name="fastest")
    assert "policy.name: unknown preset 'fastest'; known: cache_aware, dynamo_cost, least_loaded" in msg


@pytest.mark.parametrize(
    "ref, where",
    [
        ({"name": "bounded_load", "params": {"factor": 0.5}}, "policy.pipeline.filters.0.params.factor: Input should be greater than 1"),
        ({"name": "bounded_load", "params": {"facter": 3}}, "policy.pipeline.filters.0.params.facter: Extra inputs are not permitted"),
        ({"name": "cache_affinity", "params": {"cache_threshold": 2}}, "policy.pipeline.filters.0.params.cache_threshold"),
    ],
)
def test_bad_params_name_the_field(ref, where):
    assert where in config_error(pipeline={"filters": [ref]})


def test_route_generators_must_fit_the_cluster():
    assert "policy.pipeline.routes: routes 'pd_pairs': pd_pairs needs a cluster with a prefill pool" in config_error(
        pipeline={"routes": "pd_pairs"})
    assert "does not pair prefill with decode" in config_error(pd=PDConfig(), pipeline={"routes": "instances"})
    assert "a profile routes within one pool" in config_error(
        pd=PDConfig(), profiles={"prefill": {"routes": "pd_pairs"}, "decode": {}})
    assert "policy.pipeline.scorers.0: scorer 'pd_ttft'" in config_error(pipeline={"scorers": ["pd_ttft"]})


def test_pipeline_and_profiles_exclude_each_other():
    with pytest.raises(ValueError, match="not both"):
        PolicyConfig.model_validate({"pipeline": {}, "profiles": {"prefill": {}, "decode": {}}})


def test_serve_exits_2_naming_the_bad_plugin(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    bad = yaml.safe_load(EXAMPLE)
    bad["policy"]["pipeline"]["scorers"][1]["name"] = "queu"
    path.write_text(yaml.safe_dump({"instances": [{"url": "http://127.0.0.1:9"}], **bad}))
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "policy.pipeline.scorers.1.name: unknown scorer 'queu'; known:" in err and "queue" in err


def test_check_config_builds_the_form_the_cluster_needs():
    colocated = load_config(overrides={"instances": [{"url": "http://a:1"}], "policy": {"pipeline": {"scorers": ["pd_ttft"]}}})
    with pytest.raises(ConfigError, match="needs a cluster with a prefill pool"):
        check_config(colocated)
    pd = load_config(overrides={"instances": [{"url": "http://a:1", "role": "prefill"}, {"url": "http://b:1", "role": "decode"}],
                                "policy": {"pipeline": {"scorers": ["pd_ttft"]}}})
    check_config(pd)


# -- plugins from an installed distribution, through the default registry ----------------------

@pytest.fixture
def fresh_default_registry():
    default_registry.cache_clear()
    yield
    default_registry.cache_clear()  # forget the temporary distribution


def test_an_installed_plugin_is_usable_by_name_in_config(tmp_path, monkeypatch, fresh_default_registry):
    install(tmp_path, monkeypatch, {"acme": "acme_plugins"}, {"acme_plugins": PLUGIN_MODULE})
    assert default_registry() is default_registry()  # loaded once
    pol = declared(pipeline={"scorers": [{"name": "reverse_index", "params": {"offset": 1}}], "picker": "first_max"})
    assert pol.choose(req(), CANDS, snap({"a": 10})).instance == "c"
    assert declared(name="last_one").choose(req(), CANDS, snap()).instance == "c"
    assert "params.offset: Input should be a valid number" in config_error(
        pipeline={"scorers": [{"name": "reverse_index", "params": {"offset": "far"}}]})


def test_a_broken_installed_plugin_stops_the_router_naming_it(tmp_path, monkeypatch, capsys, fresh_default_registry):
    install(tmp_path, monkeypatch, {"acme": "acme_gone"}, {"acme_gone": "raise RuntimeError('half installed')\n"})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"instances": [{"url": "http://127.0.0.1:9"}]}))
    assert main(["serve", "--config", str(path)]) == 2
    assert "cannot load plugin entry point 'acme' = 'acme_gone'" in capsys.readouterr().err


def test_new_decision_is_the_dataclass_built_the_fast_way():
    from dataclasses import fields

    from router.scheduling.framework import Decision, new_decision

    given = {f.name: f"v{i}" for i, f in enumerate(fields(Decision))}
    fast = new_decision(**given)
    assert fast == Decision(**given) and fast.key == Decision(**given).key
    with pytest.raises(TypeError, match="missing \\['profiles'\\]"):
        new_decision(**{k: v for k, v in given.items() if k != "profiles"})
    with pytest.raises(TypeError, match="unknown \\['extra'\\]"):
        new_decision(**given, extra=1)
