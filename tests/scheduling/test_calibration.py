from router.scheduling.calibration import Calibrator
from router.config.model import CalibrationConfig, RouterConfig
from router.core.instances import InstancePool


def test_factor_converges_to_measured_slowdown_and_is_bounded():
    cal = Calibrator(CalibrationConfig(alpha=0.5, min_factor=0.2, max_factor=5, min_estimate_s=0.0))
    for _ in range(30):
        f = cal.factor("a")
        cal.observe("a", estimated_s=1.0 * f, actual_s=2.0)  # the engine is twice as slow as declared
    assert abs(cal.factor("a") - 2.0) < 0.05
    for _ in range(50):
        cal.observe("b", estimated_s=1.0, actual_s=100.0)
    assert cal.factor("b") == 5
    assert cal.observe("c", 0.0, 1.0) is None and cal.factor("c") == 1.0


def test_short_estimates_are_not_compared():
    cal = Calibrator(CalibrationConfig(min_estimate_s=0.05))
    assert cal.observe("a", 0.01, 0.05) is None and cal.factor("a") == 1.0
    assert cal.observe("a", 0.1, 0.2) is not None and cal.factor("a") > 1.0


def test_a_measurement_behind_a_queue_is_not_the_rates():
    from router.scheduling.calibration import queued_share
    from router.state.base import Booking, Leg, Load, Snapshot

    cal = Calibrator(CalibrationConfig(min_estimate_s=0.0, max_queued_share=0.1))
    assert cal.observe("a", 1.0, 3.0, queued=0.5) is None and cal.factor("a") == 1.0
    assert cal.observe("a", 1.0, 3.0, queued=0.1) == 3.0  # at the share: still the rate's
    snap = Snapshot({"a": 0, "b": 0}, {"a": Load(2, 500), "b": Load(1, 0, 100)})
    on = {i: Booking.single("r", i, 1000, 0) for i in ("a", "b")}
    assert queued_share(snap, on["a"], "a") == 0.5 and queued_share(snap, on["b"], "b") == 0.0
    assert queued_share(snap, Booking.single("r", "c", 0, 0), "c") == 0.0  # nothing booked there
    assert queued_share(snap, Booking.single("r", "a", 0, 0), "a") == float("inf")  # work ahead, none of its own
    pd = Booking("r", (Leg("b", 0, 10), Leg("a", 4000, 0, transient=True)), ())
    assert queued_share(snap, pd, "a") == 500 / 4000  # the prefill leg's own work, not the decode leg's
    # queue the engine reported beyond every booking (bypass traffic) is queue ahead too
    assert queued_share(snap, on["b"], "b", external=300) == 0.3


def test_a_first_byte_corrects_the_factor_its_estimate_was_made_with():
    config = CalibrationConfig(min_estimate_s=0.0, warmup=8, min_factor=0.01)
    cal, naive = Calibrator(config), Calibrator(config)
    for c in (cal, naive):
        assert c.observe("a", 1.0, 0.25, factor_then=1.0) == 0.25  # the engine is 4x faster than declared
    # three more first bytes of the same burst, priced before that correction at factor 1.0
    for _ in range(3):
        cal.observe("a", 1.0, 0.25, factor_then=1.0)
        naive.observe("a", 1.0, 0.25)  # taken against the factor now: corrected 4x again, each time
    assert abs(cal.factor("a") - 0.25) < 1e-9
    assert naive.factor("a") < 0.1
    # a measurement priced at the corrected factor moves it by its own ratio only
    assert abs(cal.observe("a", 0.5, 1.0, factor_then=0.25) - (4 * 0.25 + 0.5) / 5) < 1e-9


def test_the_calibration_hook_takes_the_rate_a_decision_was_priced_at():
    hook, pool = _hook("instance", [{"url": "http://a:1", "name": "a", "prefill_tokens_per_s": 10000}])
    # a burst decided at the declared rate; its first bytes come back a quarter of the estimate
    for _ in range(4):
        _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=0.25, rate=10000.0)
    assert abs(pool.get("a").factor - 0.25) < 1e-9
    assert abs(pool.get("a").candidate.prefill_tokens_per_s - 40000.0) < 1e-6
    # one decided after the correction, at 40000 tokens/s, and measured at its estimate: no change
    _first_byte(hook, pool, "a", estimate_s=0.5, actual_s=0.5, rate=40000.0)
    assert abs(pool.get("a").factor - 0.25) < 1e-9


def test_the_replay_calibration_takes_the_rate_a_decision_was_priced_at():
    from router.core.instances import Candidate
    from router.tools.replay.calibrate import ReplayCalibration

    candidates = [Candidate("a")]
    cal = ReplayCalibration(candidates, "m", 8000.0, lambda: 0.0,
                            CalibrationConfig(min_estimate_s=0.0, min_factor=0.01, warmup=8))
    for _ in range(4):  # priced before any calibration: at the default rate (the candidate declared none)
        cal.observe("a", 1.0, 0.25, rate_then=None)
    assert abs(candidates[0].prefill_tokens_per_s - 32000.0) < 1e-6
    cal.observe("a", 0.5, 0.5, rate_then=32000.0)
    assert abs(candidates[0].prefill_tokens_per_s - 32000.0) < 1e-6


def test_disabled_calibration_changes_nothing():
    cal = Calibrator(CalibrationConfig(enabled=False))
    assert cal.observe("a", 1.0, 3.0) is None and cal.factor("a") == 1.0


def test_pool_applies_factor_to_prefill_rate():
    pool = InstancePool(RouterConfig(instances=[{"url": "http://a:1", "name": "a", "prefill_tokens_per_s": 10000}]))
    pool.calibrate("a", 2.0)
    assert pool.get("a").candidate.prefill_tokens_per_s == 5000


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_warmup_corrects_a_wrong_default_within_a_few_requests():
    # The engine is 2.5x slower than the default rate says; the estimate tracks the factor.
    warm = Calibrator(CalibrationConfig(alpha=0.2, warmup=8, min_estimate_s=0.0))
    cold = Calibrator(CalibrationConfig(alpha=0.2, warmup=0, min_estimate_s=0.0))
    for cal in (warm, cold):
        for _ in range(3):
            cal.observe("a", estimated_s=cal.factor("a"), actual_s=2.5)
    assert abs(warm.factor("a") - 2.5) < 1e-9
    assert abs(cold.factor("a") - 2.5) / 2.5 > 0.25  # the bare EWMA is still far off


def test_a_slow_first_request_is_averaged_away_by_the_next_ones():
    cal = Calibrator(CalibrationConfig(warmup=8, min_estimate_s=0.0))
    assert cal.observe("a", estimated_s=1.0, actual_s=4.0) == 4.0
    for _ in range(3):  # the engine really is as fast as declared
        cal.observe("a", estimated_s=cal.factor("a"), actual_s=1.0)
    assert abs(cal.factor("a") - 1.75) < 1e-9  # mean of the ratios 4, 1, 1, 1


def test_a_stale_factor_relaxes_toward_the_prior_and_a_fresh_one_does_not():
    clock = Clock()
    cal = Calibrator(CalibrationConfig(min_estimate_s=0.0, stale_after_s=10, relax_half_life_s=10), clock)
    cal.observe("slow", 1.0, 4.0)  # e.g. a slow first request
    assert cal.factor("slow") == 4.0
    clock.t = 5.0
    assert cal.relax() == {}  # measured 5 s ago: still trusted
    clock.t = 20.0
    first = cal.relax()["slow"]
    assert 1.0 < first < 4.0 and abs(first - 2.0) < 0.01  # 10 s past stale = one half-life (in log space)
    clock.t = 200.0
    assert cal.relax() == {"slow": 1.0} and cal.factor("slow") == 1.0 and "slow" not in cal.factors


def test_relaxation_un_starves_an_instance_a_stale_factor_kept_away():
    # b's factor says it is 5x slow, so ttft sends nothing there and nothing re-measures it.
    # Traffic elsewhere keeps calibrating; once b's factor is stale it fades until b wins
    # requests again (where the next measurement would correct it for real).
    import random

    from router.config.model import PolicyConfig
    from router.scheduling import RouteRequest, build_policy
    from router.state.base import Load, Snapshot

    clock = Clock()
    config = RouterConfig(instances=[{"url": "http://a:1", "name": "a", "prefill_tokens_per_s": 8000},
                                     {"url": "http://b:1", "name": "b", "prefill_tokens_per_s": 8000}])
    pool = InstancePool(config)
    cal = Calibrator(CalibrationConfig(min_estimate_s=0.0, stale_after_s=10, relax_half_life_s=10), clock)
    cal.observe("b", 1.0, 5.0)
    pool.calibrate("b", cal.factor("b"))
    policy = build_policy(PolicyConfig(name="ttft"), rng=random.Random(1))
    req = RouteRequest("r", (), 4000, 16, 64)
    busy = Snapshot({"a": 0, "b": 0}, {"a": Load(1, 4000), "b": Load()})  # a has one request queued

    def choice() -> str:
        return policy.choose(req, [i.candidate for i in pool], busy).instance

    assert choice() == "a"
    chosen_b_at = None
    for second in range(1, 120):
        clock.t = float(second)
        cal.observe("a", 1.0, 1.0)  # a's traffic keeps it measured, and runs the relaxation
        for name, factor in cal.relax().items():
            pool.calibrate(name, factor)
        if choice() == "b":
            chosen_b_at = second
            break
    assert chosen_b_at is not None and chosen_b_at < 60


# -- scope: one factor per group of like instances, or per instance ------------------------

def _hook(scope: str, instances: list[dict[str, object]]) -> tuple[object, InstancePool]:
    from router.core.metrics import Metrics
    from router.request.hooks import CalibrationHook

    config = RouterConfig(instances=instances, calibration={"scope": scope, "min_estimate_s": 0.0, "warmup": 8})
    pool = InstancePool(config)
    return CalibrationHook(Calibrator(config.calibration), pool, Metrics()), pool


def _first_byte(hook: object, pool: InstancePool, instance: str, estimate_s: float, actual_s: float,
                ahead: int = 0, work: int | None = None, rate: float | None = None, external: int = 0) -> None:
    import asyncio

    from router.request.lifecycle import Attempt
    from router.scheduling.decide import Routed
    from router.scheduling.framework import Decision
    from router.state.base import Booking, Load, Snapshot

    decision = Decision(instance, frozenset({instance}), "score", estimate_s=estimate_s, prefill_work=work)
    loads = {instance: Load(1, ahead)} if ahead else {}
    routed = Routed(Booking.single("r", instance, work or 0, 0), decision, Snapshot({}, loads), 0.0, rate, external)
    attempt = Attempt("r", routed, pool.get(instance), streaming=True, first_byte_s=actual_s)
    asyncio.run(hook.first_byte(attempt))  # type: ignore[attr-defined]


def test_pool_scope_shares_one_factor_between_like_instances():
    like = [{"url": f"http://{n}:1", "name": n, "model": "m"} for n in ("a", "b")]
    hook, pool = _hook("pool", [*like, {"url": "http://c:1", "name": "c", "model": "m", "prefill_tokens_per_s": 30000}])
    _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=2.0)  # only a was measured: the default rate is 2x off
    assert pool.get("a").factor == pool.get("b").factor == 2.0
    assert pool.get("b").candidate.prefill_tokens_per_s == RouterConfig().policy.ttft.prefill_tokens_per_s / 2
    assert pool.get("c").factor == 1.0  # it declared its own rate: another group


def test_instance_scope_keeps_a_factor_per_instance():
    hook, pool = _hook("instance", [{"url": f"http://{n}:1", "name": n} for n in ("a", "b")])
    _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=2.0)
    assert pool.get("a").factor == 2.0 and pool.get("b").factor == 1.0


def test_calibration_key_groups_by_model_and_declared_rate():
    from router.scheduling.calibration import calibration_key

    assert calibration_key("pool", "a", "m", None) == calibration_key("pool", "b", "m", None)
    assert calibration_key("pool", "a", "m", None) != calibration_key("pool", "a", "m2", None)
    assert calibration_key("pool", "a", "m", 1000.0) != calibration_key("pool", "a", "m", None)
    assert calibration_key("instance", "a", "m", None) == "a"


# -- weighted measurements: the engines' own prefill windows ----------------------------------

def test_a_weight_of_w_folds_in_like_w_measurements_of_the_same_ratio():
    config = CalibrationConfig(alpha=0.2, warmup=4, min_estimate_s=0.0)
    once, repeated = Calibrator(config), Calibrator(config)
    for cal in (once, repeated):  # past the warm-up: the EWMA
        for _ in range(4):
            cal.observe("a", 1.0, 1.0)
    once.observe("a", 1.0, 3.0, weight=3)
    for _ in range(3):  # the same absolute target each time (the ratio is taken against the factor)
        repeated.observe("a", repeated.factor("a"), 3.0)
    assert abs(once.factor("a") - repeated.factor("a")) < 1e-9
    warm = Calibrator(config)
    warm.observe("a", 1.0, 4.0, weight=1)
    warm.observe("a", 4.0, 1.0, weight=3)  # the warm-up mean: (4 + 3 x 1) / 4
    assert abs(warm.factor("a") - 1.75) < 1e-9
    assert warm.observe("a", 1.0, 2.0, weight=0) is None and warm.observe("a", 1.0, 2.0, weight=float("nan")) is None


def _window(requests: float, tokens: float, seconds: float):  # type: ignore[no-untyped-def]
    from router.engines.prefill_rate import PrefillSample

    return PrefillSample(requests, tokens, seconds, "prefill_time")


def test_an_engine_window_corrects_the_rate_and_does_not_count_the_routers_own_measurements_twice():
    from router.config.engines import EngineCalibrationConfig

    weights = RouterConfig().policy.ttft.model_copy(update={"attention_s_per_token2": 0.0, "request_overhead_s": 0.0})
    half = EngineCalibrationConfig(weight=0.5)
    hook, pool = _hook("instance", [{"url": "http://a:1", "name": "a", "prefill_tokens_per_s": 10000}])
    # the engine computed 4 x 1000 tokens in 1.0 s: 4000 tokens/s where 10000 was declared
    assert hook.observe_engine("a", _window(4, 4000, 1.0), weights, half) == 2.5  # type: ignore[attr-defined]
    assert abs(pool.get("a").candidate.prefill_tokens_per_s - 4000) < 1e-6
    # two prefills measured at the first byte, then a window holding those same two: nothing new
    for _ in range(2):
        _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=1.0)
    factor = pool.get("a").factor
    assert hook.observe_engine("a", _window(2, 2000, 5.0), weights, half) is None  # type: ignore[attr-defined]
    assert pool.get("a").factor == factor
    # a window of 6 of which the router measured 2: the 4 others count (and the count starts over)
    for _ in range(2):
        _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=1.0)
    assert hook.observe_engine("a", _window(6, 6000, 6000 / 4000), weights, half) is not None  # type: ignore[attr-defined]
    assert hook.observe_engine("a", _window(2, 2000, 0.5), weights, half) is not None  # type: ignore[attr-defined]
    assert hook.observe_engine("gone", _window(2, 2000, 0.5), weights, half) is None  # type: ignore[attr-defined]
    # a window too busy to learn from still settles the count of the router's own measurements
    from router.engines.prefill_rate import PrefillSample

    for _ in range(3):
        _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=1.0)
    factor = pool.get("a").factor
    busy = PrefillSample(4, 4000, 1.0, "prefill_time", overlap=3.0)
    assert hook.observe_engine("a", busy, weights, half) is None and pool.get("a").factor == factor  # type: ignore[attr-defined]
    assert hook.observe_engine("a", _window(2, 2000, 0.5), weights, half) is not None  # type: ignore[attr-defined]


def test_the_hook_calibrates_only_from_first_bytes_with_little_booked_ahead():
    hook, pool = _hook("instance", [{"url": "http://a:1", "name": "a", "prefill_tokens_per_s": 10000}])
    _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=3.0, ahead=5000, work=1000)  # the queue's error
    assert pool.get("a").factor == 1.0
    _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=3.0, ahead=50, work=1000)
    assert pool.get("a").factor == 3.0


def test_a_decode_instance_is_not_calibrated_from_its_engine_windows():
    from router.config.engines import EngineCalibrationConfig

    hook, pool = _hook("instance", [{"url": "http://p:1", "name": "p", "role": "prefill"},
                                    {"url": "http://d:1", "name": "d", "role": "decode"}])
    weights, config = RouterConfig().policy.ttft, EngineCalibrationConfig()
    # a decode engine's prefill phase is the KV pull: few tokens computed in transfer time
    assert hook.observe_engine("d", _window(4, 8, 1.0), weights, config) is None  # type: ignore[attr-defined]
    assert pool.get("d").factor == 1.0
    assert hook.observe_engine("p", _window(4, 4000, 1.0), weights, config) is not None  # type: ignore[attr-defined]


def test_a_first_byte_behind_unbooked_engine_queue_is_not_the_rates():
    # the engine reported 5000 prefill tokens queued beyond the router's bookings when the
    # request was decided: its slow first byte measured that queue, not the rate
    hook, pool = _hook("instance", [{"url": "http://a:1", "name": "a"}])
    _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=3.0, work=1000, external=5000)
    assert pool.get("a").factor == 1.0
    _first_byte(hook, pool, "a", estimate_s=1.0, actual_s=3.0, work=1000)  # no queue ahead: the rate's
    assert pool.get("a").factor == 3.0
