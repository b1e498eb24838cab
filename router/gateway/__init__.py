"""Layer: gateway (the top of the product). The HTTP surface: the ASGI app and its routes
(OpenAI inference, models, health, readiness, metrics, admin/debug), error bodies, and the
``serve`` command that runs it.

May import: every product layer below it. Never router.tools.
"""
