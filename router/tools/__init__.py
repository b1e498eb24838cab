"""Tooling beside the product, never part of a request's path: the engine emulator, the
offline trace replay, local deployments (emulated clusters plus router processes) and the
demo. It may import the product; the product never imports it (checked in CI).
"""
