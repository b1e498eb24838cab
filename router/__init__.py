"""pd-router: a cache-aware prefill/decode router for LLM serving."""

__version__ = "0.1.0"
