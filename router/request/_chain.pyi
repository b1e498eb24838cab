"""Types of the C extension ``router.request._chain`` (source: ``_chain.c``)."""

from typing_extensions import Buffer

def chain_keys(data: Buffer, block_bytes: int, n_blocks: int, seed: int) -> list[int]: ...
