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


def test_disabled_calibration_changes_nothing():
    cal = Calibrator(CalibrationConfig(enabled=False))
    assert cal.observe("a", 1.0, 3.0) is None and cal.factor("a") == 1.0


def test_pool_applies_factor_to_prefill_rate():
    pool = InstancePool(RouterConfig(instances=[{"url": "http://a:1", "name": "a", "prefill_tokens_per_s": 10000}]))
    pool.calibrate("a", 2.0)
    assert pool.get("a").candidate.prefill_tokens_per_s == 5000
