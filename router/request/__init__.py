"""Layer: request. One inference request from body to release: parse and bound the body,
hash its prompt into block keys, ask scheduling for a route, hand it to upstream, and run
the lifecycle hooks (booking, residency, calibration, metrics) around the proxy.

May import: router.scheduling, router.upstream, router.state, router.core, router.config.
"""
