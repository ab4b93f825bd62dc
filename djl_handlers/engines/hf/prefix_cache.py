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

Sessions (LMI's stateful sessions, :mod:`djl_handlers.sessions`): a request served in an open
session pins the digest chain of its prompt to the session (a later turn's chain replaces the
earlier one: a chat resends its conversation, so the new chain holds the old one), and eviction
passes pinned blocks by, so the session's next turn finds its conversation even after other traffic
filled the cache. Pinned blocks stay in ``bytes`` and count against the bound: when only pinned
blocks are left above it, the pins of the session opened first yield (its blocks become ordinary
LRU blocks) until the cache fits. Closing a session, or its expiry, releases its pins. Sessions are
opened and closed from the server's event loop while the engine steps on its own thread: those
calls only queue the change, applied by the engine thread on its next use of the cache.

Counters, in tokens as vLLM's ``prefix_cache_queries``/``prefix_cache_hits``: ``queries`` the prompt
tokens of every request admitted while the cache is on, ``hits`` the tokens served from the cache.

A request that asks for its prompt tokens' log-probs (``decoder_input_details``) needs the prefill of
every prompt position: it neither reads the cache nor skips its prefill (its blocks are stored).
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections import OrderedDict, deque
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


@dataclass
class _Pins:
    """One open session's pinned chain and its expiry (epoch seconds)."""

    expires: float
    chain: tuple[bytes, ...] = ()


def _salt(row: Row) -> bytes:
    lora = row.lora
    if lora is None:
        return b""
    return f"{lora.name}\0{lora.src}\0{id(lora)}".encode()


class _ImagesSeen:
    """The pixel digests of the images a prompt's first tokens hold: a block's digest includes those
    of every image whose tokens started in it or before it, so the same token ids with other pixels
    never match (image tokens are one repeated id). Per-image token counts tell where each image
    starts; without them, every image counts from the first image token on."""

    def __init__(self, media: Any, token: int | None) -> None:
        self.digests: tuple[bytes, ...] = media.digests if media is not None and token is not None else ()
        self.starts: list[int] = []  # image-token count at which image k starts
        if self.digests and media.placeholder_counts:
            total = 0
            for count in media.placeholder_counts:
                self.starts.append(total)
                total += count
        self.token = token
        self.seen = 0  # image tokens in ids[:self.upto]
        self.upto = 0

    def through(self, ids: Sequence[int], end: int) -> bytes:
        """The digests of the images started within ``ids[:end]`` (called with growing ``end``)."""
        if not self.digests:
            return b""
        self.seen += sum(1 for t in ids[self.upto : end] if t == self.token)
        self.upto = end
        if not self.seen:
            return b""
        started = sum(1 for s in self.starts if s < self.seen) if self.starts else len(self.digests)
        return b"".join(self.digests[:started])


class PrefixCache:
    """Blocks of prompt KV shared across requests (see the module docstring)."""

    def __init__(self, memory_bytes: int = DEFAULT_MEMORY_BYTES, block: int = BLOCK) -> None:
        self.memory_bytes = memory_bytes
        self.block = block
        self.image_token: int | None = None  # a vision-language model's image token (its blocks name their images)
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        self.bytes = 0
        self.queries = 0
        self.hits = 0
        self.yielded = 0  # sessions whose pins yielded to the memory bound
        self._sessions: OrderedDict[str, _Pins] = OrderedDict()  # in the order they were opened
        self._pinned: dict[bytes, int] = {}  # digest -> how many sessions pin it
        self._changes: deque[tuple[str, float | None]] = deque()  # (session, expiry; None: closed)

    def __len__(self) -> int:
        return len(self._blocks)

    def digests(self, row: Row) -> list[bytes]:
        """The digest chain of the full blocks of ``row``'s prompt (computed once, kept on the row)."""
        if row.prefix_digests is not None:
            return row.prefix_digests
        ids, size = row.request.prompt_ids, self.block
        previous = hashlib.blake2b(_salt(row), digest_size=16).digest()
        chain = []
        images = _ImagesSeen(row.request.media, self.image_token)
        for start in range(0, len(ids) - size + 1, size):
            block = array("q", ids[start : start + size]).tobytes()
            previous = hashlib.blake2b(previous + block + images.through(ids, start + size), digest_size=16).digest()
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
        ``layers[i]`` = that layer's ``(keys, values)`` of the prompt's tokens, ``[kv_heads, len, head_dim]``;
        a row of an open session then pins its chain to the session."""
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
        self._apply_changes()
        session = row.request.session
        if session is not None and session in self._sessions:
            self._pin(session, tuple(chain))
        self._evict()

    # -- sessions -----------------------------------------------------------------------------
    def open_session(self, session: str, expires: float) -> None:
        """Open ``session`` (until epoch ``expires``); safe from any thread (applied on next use)."""
        self._changes.append((session, expires))

    def close_session(self, session: str) -> None:
        """Release ``session``'s pins; safe from any thread (applied on next use)."""
        self._changes.append((session, None))

    def pinned_blocks(self, session: str | None = None) -> int:
        """How many cached blocks ``session`` (None: any session) pins."""
        self._apply_changes()
        if session is None:
            return sum(1 for digest in self._pinned if digest in self._blocks)
        pins = self._sessions.get(session)
        return 0 if pins is None else sum(1 for digest in pins.chain if digest in self._blocks)

    def _apply_changes(self) -> None:
        while self._changes:
            session, expires = self._changes.popleft()
            if expires is None:
                self._release(session)
            elif session not in self._sessions:
                self._sessions[session] = _Pins(expires)
        now = time.time()
        for session in [s for s, pins in self._sessions.items() if now > pins.expires]:
            self._release(session)

    def _pin(self, session: str, chain: tuple[bytes, ...]) -> None:
        pins = self._sessions[session]
        self._unpin(pins.chain)
        pins.chain = chain
        for digest in chain:
            self._pinned[digest] = self._pinned.get(digest, 0) + 1

    def _unpin(self, chain: tuple[bytes, ...]) -> None:
        for digest in chain:
            left = self._pinned[digest] - 1
            if left:
                self._pinned[digest] = left
            else:
                del self._pinned[digest]

    def _release(self, session: str) -> None:
        pins = self._sessions.pop(session, None)
        if pins is not None:
            self._unpin(pins.chain)

    def _evict(self) -> None:
        if not self._pinned:  # no session pins anything: least recently used first, one by one
            while self.bytes > self.memory_bytes and self._blocks:
                self.bytes -= self._blocks.popitem(last=False)[1].nbytes
            return
        while self.bytes > self.memory_bytes and self._blocks:
            for digest in [d for d in self._blocks if d not in self._pinned]:  # least recently used first
                if self.bytes <= self.memory_bytes:
                    return
                self.bytes -= self._blocks.pop(digest).nbytes
            holders = [pins for pins in self._sessions.values() if pins.chain]
            if self.bytes <= self.memory_bytes or not holders:
                return
            oldest = holders[0]  # only pinned blocks are left: the session opened first yields its pins
            self._unpin(oldest.chain)
            oldest.chain = ()
            self.yielded += 1

    def stats(self) -> dict[str, int]:
        """The cumulative counters and the cache's size, for ``/metrics``."""
        return {"prefix_cache_queries": self.queries, "prefix_cache_hits": self.hits,
                "prefix_cache_bytes": self.bytes, "prefix_cache_blocks": len(self._blocks)}
