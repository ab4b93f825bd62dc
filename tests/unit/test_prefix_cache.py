"""Prefix caching on the HF engine: fp32 greedy output with the cache equals the output without it,
token for token and log-prob for log-prob, on the tiny and the embedded model as they are served;
blocks, LRU bound, counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.engines.hf.prefix_cache import BLOCK, PrefixCache  # noqa: E402
from djl_handlers.engines.hf.rows import Row  # noqa: E402
from djl_handlers.engines.hf.sampling import RowSampling  # noqa: E402
from djl_handlers.io import Input  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402
from djl_handlers.service import InferenceService  # noqa: E402
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, tiny_dir, embedded_dir

SYSTEM = ("You are a careful assistant. Answer briefly, cite the question, and never invent facts. "
          "The user is a student of physics who likes short, exact answers with units. ")
TURNS = ["What is the speed of light?", "And the speed of sound in air?", "Which one is faster, and by how much?"]


def conversation(tok: Any, turns: int, answers: list[str]) -> list[int]:
    text = SYSTEM + "".join(f"\nUser: {q}\nAssistant:{a}" for q, a in zip(TURNS[:turns], answers, strict=False))
    return list(tok.encode(text))


def drain(engine: HFEngine, limits: dict[int, int]) -> dict[int, list[StepOutput]]:
    got: dict[int, list[StepOutput]] = {rid: [] for rid in limits}
    for _ in range(400):
        if not engine.has_unfinished():
            return got
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(out)
            if len(got[out.request_id]) == limits[out.request_id]:
                engine.release(out.request_id)
    raise AssertionError("engine did not finish")


def chat(engine: HFEngine, tok: Any, new: int = 12) -> list[list[tuple[int, float | None]]]:
    """Three turns, each resending the conversation with the previous answers; the (token, log-prob)
    pairs of every answer."""
    answers: list[str] = []
    results = []
    for turn in range(1, len(TURNS) + 1):
        ids = conversation(tok, turn, answers + [""])
        engine.add_request(EngineRequest(turn, ids, GenerationParameters(max_new_tokens=new)))
        outs = drain(engine, {turn: new})[turn]
        results.append([(o.token_id, o.log_prob) for o in outs])
        answers.append(tok.decode([o.token_id for o in outs]))
    return results


def cached_engine(model: Any, tok: Any, memory: int = 1 << 30, **kwargs: Any) -> HFEngine:
    engine = HFEngine(model, tok, **kwargs)
    engine.prefix_cache = PrefixCache(memory)
    return engine


def test_multi_turn_greedy_is_byte_for_byte_the_same(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = cached_engine(model, tok)
    assert chat(engine, tok) == chat(HFEngine(model, tok), tok)  # token ids and log-probs, every bit
    cache = engine.prefix_cache
    assert cache is not None and cache.hits > 0 and cache.queries > cache.hits
    assert cache.hits % BLOCK == 0


def test_chunked_remainders_keep_the_greedy_tokens(tiny_model: Any) -> None:
    """With a prefill budget smaller than the uncached part, the rest of the prompt is prefilled in
    chunks whose boundaries differ from an uncached run's: like chunked prefill itself (which differs
    from a one-forward prefill in the last bits of the log-probs), the tokens stay the same."""
    model, tok = tiny_model
    engine = cached_engine(model, tok, max_prefill_tokens=24)
    tokens = [[t for t, _ in answer] for answer in chat(engine, tok)]
    assert tokens == [[t for t, _ in answer] for answer in chat(HFEngine(model, tok, max_prefill_tokens=24), tok)]
    assert engine.prefix_cache is not None and engine.prefix_cache.hits > 0


def served_chat(model_dir: Path, cache: bool) -> tuple[list[Any], dict[str, Any]]:
    """The three turns through the HF handler as it is served (fp32, the default CPU kernels):
    each answer's details tokens, and the engine's figures."""
    service = InferenceService("huggingface")
    init = {"model_id": str(model_dir), "dtype": "fp32", "rolling_batch": "auto",
            "enable_prefix_caching": str(cache).lower()}
    assert service.handle(Input.from_parts(init, ())) is None
    answers: list[str] = []
    tokens = []
    for turn in range(1, len(TURNS) + 1):
        text = SYSTEM + "".join(f"\nUser: {q}\nAssistant:{a}" for q, a in zip(TURNS[:turn], answers + [""],
                                                                              strict=False))
        driver = RollingBatchDriver(service.handle)
        req = driver.submit(json_request({"inputs": text, "parameters": {"max_new_tokens": 16, "details": True}}))
        driver.run()
        body = json.loads(req.text)
        answers.append(body["generated_text"])
        tokens.append(body["details"]["tokens"])
    return tokens, service.engine_stats(0)


@pytest.mark.slow
def test_embedded_model_served_multi_turn_is_byte_for_byte_the_same(embedded_dir: Path) -> None:
    with_cache, stats = served_chat(embedded_dir, cache=True)
    assert with_cache == served_chat(embedded_dir, cache=False)[0]
    assert stats["prefix_cache_hits"] >= 3 * BLOCK and stats["prefix_cache_queries"] > stats["prefix_cache_hits"]


def test_tiny_model_served_multi_turn_is_byte_for_byte_the_same(tiny_dir: Path) -> None:
    with_cache, stats = served_chat(tiny_dir, cache=True)
    assert with_cache == served_chat(tiny_dir, cache=False)[0]
    assert stats["prefix_cache_hits"] > 0


def test_tiny_model_served_shared_prefix_batch_is_byte_for_byte_the_same(tiny_dir: Path) -> None:
    """Requests sharing a system prompt, one running when the others join, through the served path
    with a bound of a few blocks (eviction while the rows built from them run)."""

    def bodies(cache: bool) -> list[str]:
        service = InferenceService("huggingface")
        init = {"model_id": str(tiny_dir), "dtype": "fp32", "rolling_batch": "auto",
                "enable_prefix_caching": str(cache).lower(), "prefix_cache_memory_bytes": "40000"}
        assert service.handle(Input.from_parts(init, ())) is None
        driver = RollingBatchDriver(service.handle)
        params = {"max_new_tokens": 10, "details": True}
        first = driver.submit(json_request({"inputs": SYSTEM + TURNS[0], "parameters": params}))
        driver.step()
        others = [driver.submit(json_request({"inputs": SYSTEM + q, "parameters": params})) for q in TURNS]
        driver.run()
        if cache:
            assert service.engine_stats(0)["prefix_cache_hits"] > 0
        return [r.text for r in (first, *others)]

    assert bodies(cache=True) == bodies(cache=False)


def test_shared_prefix_in_one_batch_and_eviction_while_rows_run(tiny_model: Any) -> None:
    """Requests sharing a system prompt join a running batch; a bound of two blocks evicts blocks the
    running rows were built from: their tokens do not change. (Token ids only: this model runs
    torch's SDPA, whose last bits differ between a padded prefill group and a one-row prefill; the
    served default, the ragged attention kernel, is exact: the served tests compare every bit.)"""
    model, tok = tiny_model
    prompts = [list(tok.encode(SYSTEM + q)) for q in TURNS]

    def run(engine: HFEngine) -> dict[int, list[int]]:
        engine.add_request(EngineRequest(0, prompts[0], GenerationParameters(max_new_tokens=10)))
        engine.step()
        for i in (1, 2):
            engine.add_request(EngineRequest(i, prompts[i], GenerationParameters(max_new_tokens=10)))
        got = drain(engine, {0: 9, 1: 10, 2: 10})
        return {k: [o.token_id for o in v] for k, v in got.items()}

    engine = cached_engine(model, tok)
    expected = run(HFEngine(model, tok))
    assert run(engine) == expected
    cache = engine.prefix_cache
    assert cache is not None and cache.hits >= 2 * (len(tok.encode(SYSTEM)) // BLOCK - 1) * BLOCK
    one_block = cache.bytes // len(cache)
    small = cached_engine(model, tok, memory=2 * one_block)
    assert run(small) == expected
    assert small.prefix_cache is not None and small.prefix_cache.bytes <= 2 * one_block


def test_samples_from_a_cached_prompt(tiny_model: Any) -> None:
    model, tok = tiny_model
    ids = list(tok.encode(SYSTEM + TURNS[0]))
    params = GenerationParameters(do_sample=True, seed=4, n=3, max_new_tokens=6)

    def run(engine: HFEngine) -> dict[int, list[int]]:
        engine.add_request(EngineRequest(1, ids, GenerationParameters(max_new_tokens=2)))
        drain(engine, {1: 2})
        engine.add_request(EngineRequest(2, ids, params, sample_ids=(3, 4)))
        return {k: [o.token_id for o in v] for k, v in drain(engine, {2: 6, 3: 6, 4: 6}).items()}

    engine = cached_engine(model, tok)
    assert run(engine) == run(HFEngine(model, tok))
    assert engine.prefix_cache is not None and engine.prefix_cache.hits > 0


def _row(ids: list[int], lora: Any = None, prompt_lp: bool = False) -> Row:
    request = EngineRequest(1, ids, GenerationParameters())
    return Row(request, RowSampling(), prompt_lp=prompt_lp, lora=lora)


def _kv(n: int, fill: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), fill), torch.full((2, n, 4), -fill)) for _ in range(3)]


def test_blocks_chain_salt_and_lru() -> None:
    cache = PrefixCache(memory_bytes=1 << 20, block=4)
    a = _row(list(range(10)))
    assert len(cache.digests(a)) == 2 and cache.cached_blocks(a) == 0
    cache.store(a, _kv(10, 1.0))
    assert len(cache) == 2
    longer = _row(list(range(9)) + [99, 5, 6, 7])
    assert cache.cached_blocks(longer) == 2  # the first 8 tokens match
    exact = _row(list(range(8)))
    assert cache.cached_blocks(exact) == 1  # the last token is always computed
    other = _row([1, 0, 2, 3, 4, 5, 6, 7, 8])
    assert cache.cached_blocks(other) == 0  # a block is found only after the same tokens from the start

    class Lora:
        name, src = "a", "/adapters/a"

    assert cache.cached_blocks(_row(list(range(10)), lora=Lora())) == 0  # an adapter changes the KV
    assert cache.cached_blocks(_row(list(range(10)), prompt_lp=True)) == 0
    loaded = cache.load(longer, 2, _FakeCache(3))
    assert loaded.layers[0].keys.shape == (1, 2, 8, 4) and bool((loaded.layers[0].keys == 1.0).all())
    block_bytes = cache.bytes // 2
    cache.memory_bytes = 3 * block_bytes
    cache.store(_row([50, 51, 52, 53, 54, 55, 56, 57, 58]), _kv(9, 2.0))  # two more blocks: one must go
    assert len(cache) == 3 and cache.bytes == 3 * block_bytes
    assert cache.cached_blocks(longer) == 1  # the oldest chain lost its deepest block, not its first


class _FakeLayer:
    def adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class _FakeCache:
    def __init__(self, layers: int) -> None:
        self.layers = [_FakeLayer() for _ in range(layers)]


def test_metrics_count_the_worker_totals_as_vllm_names_them() -> None:
    from djl_handlers.server.metrics import Metrics

    metrics = Metrics("m")

    def value(name: str) -> float:
        return metrics.registry.get_sample_value(f"djl_handlers_{name}_total", {"model": "m"}) or 0.0

    metrics.engine_stats({"prefix_cache_queries": 100, "prefix_cache_hits": 64})
    metrics.engine_stats({"prefix_cache_queries": 150, "prefix_cache_hits": 96})
    assert (value("prefix_cache_queries"), value("prefix_cache_hits")) == (150, 96)
    metrics.engine_stats({"prefix_cache_queries": 20, "prefix_cache_hits": 16})  # a new worker starts from 0
    assert (value("prefix_cache_queries"), value("prefix_cache_hits")) == (170, 112)
    metrics.engine_stats({"kv_cache_usage": 0.5})  # no prefix cache figures: nothing counted
    assert value("prefix_cache_queries") == 170


def test_async_mode_uses_the_cache_and_answers_as_without(tiny_dir: Path) -> None:
    import asyncio

    from djl_handlers.testing.async_loop import AsyncModeClient

    async def answers(cache: bool) -> tuple[list[str], dict[str, Any]]:
        service = InferenceService("huggingface")
        client = AsyncModeClient(service.handle)
        init = {"model_id": str(tiny_dir), "dtype": "fp32", "rolling_batch": "disable",
                "enable_prefix_caching": str(cache).lower()}
        assert await client.init(init) is None
        try:
            texts = []
            for question in TURNS:  # one after the other: each finds the system prompt's blocks
                got = await client.request({"inputs": SYSTEM + question,
                                            "parameters": {"max_new_tokens": 8, "details": True}})
                assert got.code == 200
                texts.append(got.text)
            return texts, service.engine_stats(0)
        finally:
            assert service.async_mode is not None
            service.async_mode.close()

    with_cache, stats = asyncio.run(answers(True))
    assert with_cache == asyncio.run(answers(False))[0]
    assert stats["prefix_cache_hits"] > 0
