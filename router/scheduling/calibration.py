"""Online calibration: keep TTFT estimates honest by measuring them.

Each observation compares the measured time (first byte seen by the router, or the
prefill leg's answer) with what the policy predicted, and moves the instance's slowdown
factor toward actual/estimated by an EWMA. The pool divides the instance's prefill rate
by that factor, so queue and prefill estimates both track the hardware actually serving.
"""

from __future__ import annotations

from router.config.model import CalibrationConfig


class Calibrator:
    def __init__(self, config: CalibrationConfig) -> None:
        self._config = config
        self.factors: dict[str, float] = {}

    def factor(self, instance: str) -> float:
        return self.factors.get(instance, 1.0)

    def observe(self, instance: str, estimated_s: float, actual_s: float) -> float | None:
        """Fold one measurement in; return the new factor (None when nothing changed)."""
        if not self._config.enabled or estimated_s <= 0 or actual_s <= 0 or estimated_s < self._config.min_estimate_s:
            return None
        c = self._config
        ratio = actual_s / estimated_s
        target = self.factor(instance) * ratio
        new = (1 - c.alpha) * self.factor(instance) + c.alpha * target
        new = min(c.max_factor, max(c.min_factor, new))
        self.factors[instance] = new
        return new
