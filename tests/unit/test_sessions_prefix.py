"""Stateful sessions pin their prefix-cache blocks (HF engine): pins survive eviction, yield oldest
first past the memory bound, go on close and expiry; a session's turns hit their conversation after
other traffic filled the cache, and answer as without a session (tiny random model, greedy, async mode)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.base import EngineRequest  # noqa: E402
from djl_handlers.engines.hf.prefix_cache import PrefixCache  # noqa: E402
from djl_handlers.engines.hf.rows import Row  # noqa: E402
from djl_handlers.engines.hf.sampling import RowSampling  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402
from djl_handlers.service import InferenceService  # noqa: E402
from djl_handlers.sessions.gate import HEADER_SESSION_ID  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_dir


def _row(ids: list[int], session: str | None = None) -> Row:
    return Row(EngineRequest(1, ids, GenerationParameters(), session=session), RowSampling())


def _kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.ones(2, n, 4), torch.ones(2, n, 4)) for _ in range(2)]


def _fill(cache: PrefixCache, first: int, rows: int) -> None:
    for start in range(first, first + rows):
        cache.store(_row([start * 100 + i for i in range(9)]), _kv(9))  # two blocks each


def _cache_after_traffic(pinned: bool) -> tuple[PrefixCache, Row]:
    cache = PrefixCache(memory_bytes=1 << 20, block=4)
    if pinned:
        cache.open_session("s", time.time() + 60)
    turn = _row(list(range(9)), session="s")
    cache.store(turn, _kv(9))
    cache.memory_bytes = 4 * (cache.bytes // 2)  # room for four blocks
    _fill(cache, 1, 3)  # six more blocks of other prompts
    return cache, _row(list(range(12)))


def test_pins_survive_other_traffic_and_count_against_the_bound() -> None:
    cache, next_turn = _cache_after_traffic(pinned=True)
    assert cache.cached_blocks(next_turn) == 2 and cache.pinned_blocks("s") == 2
    assert cache.bytes <= cache.memory_bytes and len(cache) == 4  # the pinned two are inside the bound
    unpinned, next_turn = _cache_after_traffic(pinned=False)  # the same traffic without the session
    assert unpinned.cached_blocks(next_turn) == 0
    cache.close_session("s")
    assert cache.pinned_blocks("s") == 0 and cache.cached_blocks(next_turn) == 2  # released, still cached
    _fill(cache, 5, 2)
    assert cache.cached_blocks(next_turn) == 0  # now ordinary LRU blocks


def test_the_oldest_sessions_pins_yield_past_the_bound_and_expired_ones_go() -> None:
    cache = PrefixCache(memory_bytes=1 << 20, block=4)
    cache.open_session("old", time.time() + 60)
    cache.open_session("new", time.time() + 60)
    cache.store(_row(list(range(9)), session="old"), _kv(9))
    cache.memory_bytes = 3 * (cache.bytes // 2)
    cache.store(_row(list(range(50, 59)), session="new"), _kv(9))  # four pinned blocks, room for three
    assert cache.yielded == 1 and cache.pinned_blocks("old") == 0 and cache.pinned_blocks("new") == 2
    assert cache.cached_blocks(_row(list(range(50, 62)))) == 2
    cache.open_session("gone", time.time() - 1)  # already expired: its rows pin nothing
    cache.store(_row(list(range(70, 79)), session="gone"), _kv(9))
    assert cache.pinned_blocks("gone") == 0 and cache.pinned_blocks() == 2


SYSTEM = ("You are a careful assistant. Answer briefly, cite the question, and never invent facts. "
          "The user is a student of physics who likes short, exact answers with units. ")
TURNS = ["What is the speed of light?", "And the speed of sound in air?", "Which one is faster?"]
OTHER = "Unrelated traffic number {n}: " + "a long prompt about other things, " * 6


async def _conversation(tiny_dir: Path, root: Path, session: bool) -> tuple[list[str], list[int]]:
    """Three turns, each followed by two unrelated prompts, with or without a session; the answers and
    each turn's prefix-cache hits (tokens)."""
    from djl_handlers.testing.async_loop import AsyncModeClient

    service = InferenceService("huggingface")
    client = AsyncModeClient(service.handle)
    await client.init({"model_id": str(tiny_dir), "dtype": "fp32", "rolling_batch": "disable",
                       "enable_prefix_caching": "true", "enable_stateful_sessions": "true",
                       "sessions_path": str(root)})
    cache = getattr(service.engine, "prefix_cache", None)
    assert cache is not None
    headers: dict[str, str] = {}
    if session:
        created = await client.request({"requestType": "NEW_SESSION"})
        assert created.code == 200, created.text
        headers = {HEADER_SESSION_ID: created.headers[HEADER_SESSION_ID].split(";")[0]}
    texts, hits, answers = [], [], ""
    try:
        for turn, question in enumerate(TURNS):
            answers += f"\nUser: {question}\nAssistant:"
            before = cache.hits
            got = await client.request({"inputs": SYSTEM + answers, "parameters": {"max_new_tokens": 6}}, **headers)
            assert got.code == 200, got.text
            hits.append(cache.hits - before)
            if turn == 0:  # room for seven blocks: the conversation's, and too few for the other traffic too
                cache.memory_bytes = 7 * (cache.bytes // len(cache))
            text = got.json()["generated_text"]
            texts.append(text)
            answers += text
            for n in range(2):
                other = await client.request({"inputs": OTHER.format(n=f"{turn}-{n}"),
                                              "parameters": {"max_new_tokens": 2}})
                assert other.code == 200
        return texts, hits
    finally:
        assert service.async_mode is not None
        service.async_mode.close()


def test_a_sessions_turns_hit_its_pinned_prefix_and_answer_as_without(tiny_dir: Path, tmp_path: Path) -> None:
    with_session, pinned_hits = asyncio.run(_conversation(tiny_dir, tmp_path / "a", session=True))
    without, plain_hits = asyncio.run(_conversation(tiny_dir, tmp_path / "b", session=False))
    assert with_session == without  # greedy answers are the same
    assert all(h >= 32 for h in pinned_hits[1:]), pinned_hits  # each later turn finds its conversation
    assert all(p > q for p, q in zip(pinned_hits[1:], plain_hits[1:], strict=True)), (pinned_hits, plain_hits)
