"""Prefix caching for the HF engine (``option.enable_prefix_caching``): the KV of prompts, kept in
blocks of ``BLOCK`` tokens across requests, so a prompt that starts like an earlier one (a chat that
resends its conversation, a shared system prompt) prefills only the tokens after the cached part.

Blocks: a prompt's full blocks are keyed by a chain of digests (BLAKE2b over the previous block's
digest and this block's token ids, salted with the request's LoRA adapter, whose weights change the
KV), so a block is found only after exactly the same tokens from the start. After a prompt's
prefill every full block not cached yet is copied out of the prefill's KV (the rows' own slab is
not touched). A new request looks up its longest cached run of blocks, leaving at least its last
token to compute (its logits choose the first token): on a hit the engine starts the request as a
chunked prefill whose cache already holds those blocks, copied into the request's own slab. Rows
never read the cache in place, so evicting a block can never change a running request.

Bound: ``option.prefix_cache_memory_bytes`` (default 1 GiB); past it the least recently used blocks
go, the deepest blocks of a chain first (a hit refreshes a chain from its last block to its first),
so a chain is cut from its end and its remaining blocks stay reachable.

Counters, in tokens as vLLM's ``prefix_cache_queries``/``prefix_cache_hits``: ``queries`` the prompt
tokens of every request admitted while the cache is on, ``hits`` the tokens served from the cache.

A request that asks for its prompt tokens' log-probs (``decoder_input_details``) needs the prefill of
every prompt position: it neither reads the cache nor skips its prefill (its blocks are stored).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from djl_handlers.engines.hf.rows import Row

__all__ = ["BLOCK", "DEFAULT_MEMORY_BYTES", "PrefixCache", "prompt_kv"]

BLOCK = 16  # tokens per cached block (vLLM's default block size)
DEFAULT_MEMORY_BYTES = 1 << 30


@dataclass
class _Block:
    """One block's keys and values per layer, each ``[kv_heads, BLOCK, head_dim]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    nbytes: int


def prompt_kv(layers: Sequence[Any], row: int, start: int, stop: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the ``(keys, values)`` views of columns ``start:stop`` of batch row ``row`` of a
    prefill's slab cache layers (what :meth:`PrefixCache.store` copies blocks from)."""
    return [(layer.keys[row, :, start:stop], layer.values[row, :, start:stop]) for layer in layers]


def _salt(row: Row) -> bytes:
    lora = row.lora
    if lora is None:
        return b""
    return f"{lora.name}\0{lora.src}\0{id(lora)}".encode()


class PrefixCache:
    """Blocks of prompt KV shared across requests (see the module docstring)."""

    def __init__(self, memory_bytes: int = DEFAULT_MEMORY_BYTES, block: int = BLOCK) -> None:
        self.memory_bytes = memory_bytes
        self.block = block
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        self.bytes = 0
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def digests(self, row: Row) -> list[bytes]:
        """The digest chain of the full blocks of ``row``'s prompt (computed once, kept on the row)."""
        if row.prefix_digests is not None:
            return row.prefix_digests
        ids, size = row.request.prompt_ids, self.block
        previous = hashlib.blake2b(_salt(row), digest_size=16).digest()
        chain = []
        for start in range(0, len(ids) - size + 1, size):
            block = array("q", ids[start : start + size]).tobytes()
            previous = hashlib.blake2b(previous + block, digest_size=16).digest()
            chain.append(previous)
        row.prefix_digests = chain
        return chain

    def cached_blocks(self, row: Row) -> int:
        """How many leading blocks of ``row``'s prompt the cache holds, leaving at least its last
        token to compute; 0 for a row that asks for prompt log-probs."""
        if row.prompt_lp:
            return 0
        chain = self.digests(row)
        usable = min(len(chain), (len(row.request.prompt_ids) - 1) // self.block)
        count = 0
        while count < usable and chain[count] in self._blocks:
            count += 1
        return count

    def admitted(self, row: Row, blocks: int) -> None:
        """Count ``row``'s prompt as queried and ``blocks`` of it as hit (once, when it is admitted)."""
        self.queries += len(row.request.prompt_ids)
        self.hits += blocks * self.block

    def load(self, row: Row, blocks: int, cache: Any) -> Any:
        """Fill ``cache`` (a fresh slab cache of one row) with the first ``blocks`` blocks of
        ``row``'s prompt (copies), refresh them in the LRU order and return ``cache``."""
        chain = self.digests(row)[:blocks]
        found = [self._blocks[digest] for digest in chain]
        for digest in reversed(chain):  # the first block ends up most recent: chains lose their ends first
            self._blocks.move_to_end(digest)
        for index, layer in enumerate(cache.layers):
            keys = torch.cat([b.keys[index] for b in found], dim=1).unsqueeze(0)
            values = torch.cat([b.values[index] for b in found], dim=1).unsqueeze(0)
            layer.adopt(keys, values)
        return cache

    def store(self, row: Row, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy the full blocks of ``row``'s prompt that are not cached yet out of its prefilled KV:
        ``layers[i]`` = that layer's ``(keys, values)`` of the prompt's tokens, ``[kv_heads, len, head_dim]``."""
        chain = self.digests(row)
        for index in reversed(range(len(chain))):
            digest = chain[index]
            if digest in self._blocks:
                self._blocks.move_to_end(digest)
                continue
            cols = slice(index * self.block, (index + 1) * self.block)
            keys = [k[:, cols].clone() for k, _ in layers]
            values = [v[:, cols].clone() for _, v in layers]
            size = sum(t.numel() * t.element_size() for t in (*keys, *values))
            self._blocks[digest] = _Block(keys, values, size)
            self._blocks.move_to_end(digest, last=True)
            self.bytes += size
        self._evict()

    def _evict(self) -> None:
        while self.bytes > self.memory_bytes and self._blocks:
            _, block = self._blocks.popitem(last=False)
            self.bytes -= block.nbytes

    def stats(self) -> dict[str, int]:
        """The cumulative counters and the cache's size, for ``/metrics``."""
        return {"prefix_cache_queries": self.queries, "prefix_cache_hits": self.hits,
                "prefix_cache_bytes": self.bytes, "prefix_cache_blocks": len(self._blocks)}
