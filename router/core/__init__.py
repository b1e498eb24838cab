"""Layer: core. What every upper layer shares: the error hierarchy, the metrics registry, and
the instances the router knows (their static facts, health and circuit state).

May import: router.config.
"""
