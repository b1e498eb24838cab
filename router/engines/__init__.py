"""Knowing the engines: load read from their /metrics, facts from /v1/models and their
cache configuration, kept in an in-memory book the request path reads without I/O."""
