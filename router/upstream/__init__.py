"""Layer: upstream. Talking to engine instances: the keep-alive connection pool, relaying an
answer back to the client chunk by chunk, and the two PD handoff protocols (SGLang
bootstrap rooms, vLLM ``kv_transfer_params``).

May import: router.core, router.config. Never router.scheduling (a sibling): what to send
where is decided above, this layer only carries it out.
"""
