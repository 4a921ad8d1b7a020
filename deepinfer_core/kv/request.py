"""What the KV manager needs of a request: its tokens, how many are computed, and its block tables.

The engine's sequences satisfy this protocol; the KV manager never sees the engine's types, so the kv
layer stays below the engine.
"""

from __future__ import annotations

from typing import Protocol


class KVRequest(Protocol):
    token_ids: list[int]
    num_computed: int  # tokens whose state is in the KV pools
    #: group name -> physical block ids, ``-1`` where a window block was released
    block_tables: dict[str, list[int]]
    #: chain hashes of the leading full blocks of ``token_ids`` (filled in by the KV manager)
    block_hashes: list[int]
    num_committed_blocks: int  # leading full blocks already offered to the prefix cache
    #: ``(start, end, digest)`` of each image span in ``token_ids``: a block that overlaps a span hashes the
    #: image's content too (a span's token ids are all the same placeholder id, whatever the image)
    image_keys: tuple[tuple[int, int, bytes], ...]
    #: bumped by the KV manager whenever it changes ``block_tables`` (a copy of them, such as the engine's
    #: persistent batch, rewrites a request's rows only when this moved)
    tables_version: int

    @property
    def num_tokens(self) -> int: ...

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs need every prompt position computed: such a request never resumes from cache."""
        ...
