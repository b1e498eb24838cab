"""Routing policies: the same objects serve the live router, benchmarks and replay."""

from router.policy.base import Candidate, Decision, Pipeline, Policy, RouteRequest, View
from router.policy.builtin import build_policy

__all__ = ["Candidate", "Decision", "Pipeline", "Policy", "RouteRequest", "View", "build_policy"]
