"""The HF engine's static-shape decode step (``option.decode_graphs=static``, the path CUDA graphs
replay) on the CPU: greedy tokens equal to the dynamic step and to ``generate()`` alone while rows
cross row and column buckets, finish mid-bucket and join; the mirror is reused between steps; steps
that do not fit fall back; the option's values."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.decode_graphs import (  # noqa: E402
    DecodeGraphs,
    capture_sizes,
    resolve_mode,
    width_bucket,
)
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import ConfigError  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, real_model

PROMPTS = [
    "Hello there",
    "The capital of France is a city that",
    "x",
    "Deep learning is",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen",
    "a b c",
    "Once upon a time",
    "Why",
]
# Rows finish at different steps (mid-bucket); the longest ones cross the 64-column bucket.
NEWS = [70, 9, 40, 12, 50, 3, 25, 60]


def drive(engine: HFEngine, prompts: list[list[int]], news: list[int], joins: list[int]) -> dict[int, list[int]]:
    """Add request ``i`` at step ``joins[i]``; release it at ``news[i]`` tokens; every token id."""
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    step = 0
    while step <= max(joins) or engine.has_unfinished():
        for i, join in enumerate(joins):
            if join == step:
                engine.add_request(EngineRequest(i, prompts[i], GenerationParameters(max_new_tokens=news[i])))
        outs: list[StepOutput] = engine.step()
        for out in outs:
            assert out.error is None, out.error
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= news[out.request_id]:
                engine.release(out.request_id)
        step += 1
        assert step < 1000
    return got


def alone(model: Any, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0, len(ids):].tolist()]


def engine_with(model: Any, tok: Any, mode: str | None, sizes: tuple[int, ...] | None = (1, 2, 4)) -> HFEngine:
    engine = HFEngine(model, tok, max_batch_size=8, max_prefill_tokens=16)
    if mode is not None:
        engine.use_decode_graphs(mode, sizes)
    return engine


@pytest.mark.parametrize("joins", [[0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 9, 9, 20, 30, 31]])
def test_static_steps_equal_dynamic_steps_and_generate(tiny_model: Any, joins: list[int]) -> None:
    model, tok = tiny_model
    prompts = [tok.encode(p) for p in PROMPTS]
    dynamic = drive(engine_with(model, tok, None), prompts, NEWS, joins)
    engine = engine_with(model, tok, "static")
    static = drive(engine, prompts, NEWS, joins)
    assert static == dynamic
    for i, ids in enumerate(prompts):
        assert static[i] == alone(model, ids, NEWS[i]), f"request {i}"
    graphs = engine.decode_graphs
    assert graphs is not None
    stats = graphs.stats
    assert stats["eager_steps"] == 0 and stats["static_steps"] > 0
    # the mirror is copied in only when the batch changed, not at every step
    assert 0 < stats["mirror_loads"] < stats["static_steps"] // 2
    assert not engine.has_unfinished() and engine.kv_shape == (0, 0)


def test_buckets_used_cross_rows_and_columns(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = engine_with(model, tok, "static")
    graphs = engine.decode_graphs
    assert graphs is not None
    seen: set[tuple[int, int]] = set()
    original = graphs._run

    def spy(bucket: Any) -> torch.Tensor:
        seen.add((bucket.rows, bucket.width))
        return original(bucket)

    graphs._run = spy  # type: ignore[method-assign]
    prompts = [tok.encode(p) for p in PROMPTS]
    drive(engine, prompts, NEWS, list(range(len(prompts))))
    rows = {r for r, _ in seen}
    widths = {w for _, w in seen}
    assert {1, 2, 4, 8} <= rows  # 8 = the batch limit, always a bucket
    assert {64, 128} <= widths


def test_more_rows_than_the_largest_size_fall_back_and_stay_exact(tiny_model: Any) -> None:
    model, tok = tiny_model
    prompts = [tok.encode(p) for p in PROMPTS[:5]]
    news = [20, 18, 16, 14, 12]
    engine = HFEngine(model, tok, max_batch_size=8, max_prefill_tokens=512)
    engine.decode_graphs = DecodeGraphs(model, engine._forward, "static", (1, 2))  # rows 3-5: dynamic
    got = drive(engine, prompts, news, [0] * 5)
    for i, ids in enumerate(prompts):
        assert got[i] == alone(model, ids, news[i])
    stats = engine.decode_graphs.stats
    assert stats["eager_steps"] > 0 and stats["static_steps"] > 0


def test_log_probs_and_sampling_match_the_dynamic_step(tiny_model: Any) -> None:
    model, tok = tiny_model
    prompts = [tok.encode(p) for p in PROMPTS[:4]]

    def outputs(mode: str | None) -> list[StepOutput]:
        engine = engine_with(model, tok, mode)
        for i, ids in enumerate(prompts):
            params = GenerationParameters(max_new_tokens=12, do_sample=True, seed=i + 7, top_k=20)
            engine.add_request(EngineRequest(i, ids, params))
        got: list[StepOutput] = []
        while engine.has_unfinished():
            for out in engine.step():
                got.append(out)
                if sum(o.request_id == out.request_id for o in got) >= 12:
                    engine.release(out.request_id)
        return got

    dynamic, static = outputs(None), outputs("static")
    assert [(o.request_id, o.token_id) for o in static] == [(o.request_id, o.token_id) for o in dynamic]
    assert all(o.log_prob is not None for o in static)
    assert [o.log_prob for o in static] == pytest.approx([o.log_prob for o in dynamic], abs=1e-4)


def test_capture_sizes_and_width_buckets() -> None:
    assert capture_sizes(1) == (1,)
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert capture_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert capture_sizes(32, [64, 4, 1]) == (1, 4, 32)
    assert [width_bucket(n) for n in (1, 64, 65, 129, 1000)] == [64, 64, 128, 256, 1024]


def test_resolve_mode() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_mode("auto", cpu) == "off"
    assert resolve_mode("auto", cuda) == "off"  # until replay is checked on a GPU
    assert resolve_mode("cuda_graphs", cuda) == "cuda_graphs"
    assert resolve_mode("auto", cuda, enforce_eager=True) == "off"
    assert resolve_mode("cuda_graphs", cpu) == "off"
    assert resolve_mode("static", cpu) == "static"
    assert resolve_mode("compile", cpu) == "compile"


def _config(**options: str) -> ServingConfig:
    return ServingConfig.from_properties({"rolling_batch": "scheduler", **options}, engine="huggingface")


def test_options_are_typed() -> None:
    hf = _config().hf
    assert (hf.decode_graphs, hf.enforce_eager, hf.cudagraph_capture_sizes) == ("auto", False, None)
    hf = _config(decode_graphs="STATIC", enforce_eager="true", cudagraph_capture_sizes="[8, 1,2]").hf
    assert (hf.decode_graphs, hf.enforce_eager, hf.cudagraph_capture_sizes) == ("static", True, (1, 2, 8))
    with pytest.raises(ConfigError, match="decode_graphs"):
        _config(decode_graphs="always")
    with pytest.raises(ConfigError, match="cudagraph_capture_sizes"):
        _config(cudagraph_capture_sizes="1,0")
