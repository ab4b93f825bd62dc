"""``option.kv_cache_memory_bytes``: the HF engine's KV cache stays within its bound. A request that
fits only after others finish waits (and then gives the same tokens as alone); one that can never
fit is refused at once with a 507 naming the option; the option's values; KV bytes per token in
the engine's stats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import generate_tokens  # noqa: E402

from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.engines.base import EngineRequest  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.engines.hf.kv_budget import AUTO_SHARE, bytes_per_token, free_memory, kv_limit  # noqa: E402
from djl_handlers.errors import ConfigError, EngineOutOfMemory, status_of  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]


def _request(rid: int, ids: list[int], new: int) -> EngineRequest:
    return EngineRequest(rid, ids, GenerationParameters(max_new_tokens=new))


def _run(engine: HFEngine, requests: list[EngineRequest]) -> tuple[dict[int, list[int]], list[tuple[int, ...]]]:
    """Step until every request has its ``max_new_tokens``; returns the tokens and the running ids of
    each step, checking at every step that the padded slab stays within the bound."""
    got: dict[int, list[int]] = {r.request_id: [] for r in requests}
    running: list[tuple[int, ...]] = []
    limits = {r.request_id: r.params.max_new_tokens for r in requests}
    for r in requests:
        engine.add_request(r)
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= limits[out.request_id]:
                engine.release(out.request_id)
        rows, width = engine.kv_shape
        assert engine.kv_cache_max_bytes is not None
        assert rows * width * engine.kv_bytes_per_token <= engine.kv_cache_max_bytes
        running.append(engine.running_ids)
    return got, running


def test_a_request_that_does_not_fit_beside_the_running_ones_waits_and_then_runs(tiny_model: Any) -> None:
    model, tok = tiny_model
    prompts = [tok.encode("The capital of France is a city that"), tok.encode("Hello there, my friend"),
               tok.encode("x")]
    news = [9, 6, 4]
    per_token = bytes_per_token(model)
    alone = (len(prompts[0]) + news[0] + len(prompts[0])) * per_token  # its worst case plus its prefill
    engine = HFEngine(model, tok, kv_cache_max_bytes=alone)
    got, running = _run(engine, [_request(i, p, n) for i, (p, n) in enumerate(zip(prompts, news, strict=True))])
    assert got == dict(enumerate(generate_tokens(model, prompts, news)))  # each as alone
    # the first request ran alone (nothing else fits beside its worst case); the two short ones then share
    assert running[0] == (0,) and all(ids == (0,) for ids in running[: running.index(())])
    assert (1, 2) in running


def test_without_a_bound_the_same_requests_share_the_batch(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, kv_cache_max_bytes=10**12)
    _, running = _run(engine, [_request(i, tok.encode(p), 5) for i, p in enumerate(("Hello", "Hi there", "x"))])
    assert max(len(ids) for ids in running) == 3


def test_a_request_that_can_never_fit_is_refused_with_507(tiny_model: Any) -> None:
    model, tok = tiny_model
    ids = tok.encode("Hello there")
    per_token = bytes_per_token(model)
    engine = HFEngine(model, tok, kv_cache_max_bytes=(2 * len(ids) + 8) * per_token)
    engine.add_request(_request(1, ids, 8))  # exactly fits
    with pytest.raises(EngineOutOfMemory, match="option.kv_cache_memory_bytes allows") as info:
        engine.add_request(_request(2, ids, 9))
    assert status_of(info.value) == 507
    assert not any(out.request_id == 2 for out in engine.step())  # never queued


def _engine(tiny_dir: Path, **options: str) -> HFEngine:
    props = {"model_id": str(tiny_dir), "rolling_batch": "scheduler", **options}
    return HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))


def test_the_option_sets_the_bound_and_the_stats_report_it(tiny_dir: Path) -> None:
    engine = _engine(tiny_dir, kv_cache_memory_bytes="3M")
    assert engine.kv_cache_max_bytes == 3 * 2**20
    stats = engine.kv_cache_usage()
    assert stats["kv_bytes_per_token"] == bytes_per_token(engine.model) and stats["kv_cache_max_bytes"] == 3 * 2**20
    assert set(stats["cpu_patches"]) >= {"cpu_linear", "cpu_norm", "cpu_attention"}
    assert _engine(tiny_dir, kv_cache_memory_bytes="0").kv_cache_max_bytes is None  # no bound
    assert "kv_cache_max_bytes" not in _engine(tiny_dir, kv_cache_memory_bytes="0").kv_cache_usage()


def test_auto_is_a_share_of_the_free_memory() -> None:
    free = free_memory(torch.device("cpu"))
    assert free is not None and free > 0
    got = kv_limit(None, torch.device("cpu"), 1024)
    assert got is not None and abs(got - AUTO_SHARE * free) < 0.1 * free  # free memory moves a little meanwhile
    assert kv_limit(0, torch.device("cpu"), 1024) is None
    assert kv_limit(12345, torch.device("cpu"), 1024) == 12345


@pytest.mark.parametrize(("value", "want"), [("auto", None), ("0", 0), ("4096", 4096), ("2G", 2 * 2**30),
                                             ("1.5g", 1_500_000_000), ("512K", 512 * 1024), ("8k", 8000)])
def test_option_values(value: str, want: int | None) -> None:
    config = ServingConfig.from_properties({"kv_cache_memory_bytes": value}, engine="huggingface")
    assert config.hf.kv_cache_memory_bytes == want


@pytest.mark.parametrize("value", ["-1", "lots", "2GiB", "1e9"])
def test_bad_option_values_name_the_option(value: str) -> None:
    with pytest.raises(ConfigError, match="option.kv_cache_memory_bytes"):
        ServingConfig.from_properties({"kv_cache_memory_bytes": value}, engine="huggingface")
