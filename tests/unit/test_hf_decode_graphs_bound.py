"""The decode graphs' KV mirror under ``option.kv_cache_memory_bytes`` (the ``static`` mode on the CPU):
the running rows' cache plus the mirror stay within the bound at every step; a request waits while
the mirror the running rows use takes its room, a mirror that does not fit makes steps fall back to
the dynamic forward, and the greedy tokens still equal ``generate()``; the reported mirror bytes are
the buffers' bytes. And what the step must not keep or reuse: a finished batch's slab, a mirror of
another dtype; in ``compile`` mode the buffers a compiled step writes are marked static."""

from __future__ import annotations

import copy
import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import generate_tokens  # noqa: E402

from djl_handlers.engines.base import EngineRequest  # noqa: E402
from djl_handlers.engines.hf.decode_graphs import MIN_WIDTH, width_bucket  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.engines.hf.kv_budget import bytes_per_token  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]

PROMPTS = ("The capital of France is", "Hello there, my friend")
NEWS = (30, 24)


def _engine(model: Any, tok: Any, bound: int | None, graphs: bool = True) -> HFEngine:
    engine = HFEngine(model, tok, max_batch_size=4, kv_cache_max_bytes=bound)
    if graphs:
        engine.use_decode_graphs("static", (1, 2, 4))
    return engine


def _mirror_tensors(engine: HFEngine) -> list[torch.Tensor]:
    graphs = engine.decode_graphs
    return [*graphs.mirror.keys, *graphs.mirror.values] if graphs is not None else []


def _run(engine: HFEngine, prompts: list[list[int]], news: tuple[int, ...], joins: tuple[int, ...]
         ) -> tuple[dict[int, list[int]], list[tuple[int, ...]]]:
    """Add request ``i`` at step ``joins[i]``, release it at ``news[i]`` tokens; the tokens and the running
    ids of each step. After every step: the slab (rows x width) plus the mirror's buffers stay within the
    bound, and the engine reports exactly the bytes of those buffers."""
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    running: list[tuple[int, ...]] = []
    per_token, bound = engine.kv_bytes_per_token, engine.kv_cache_max_bytes
    step = 0
    while step <= max(joins) or engine.has_unfinished():
        for i, join in enumerate(joins):
            if join == step:
                engine.add_request(EngineRequest(i, prompts[i], GenerationParameters(max_new_tokens=news[i])))
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= news[out.request_id]:
                engine.release(out.request_id)
        mirror = sum(t.numel() * t.element_size() for t in _mirror_tensors(engine))
        if engine.decode_graphs is not None:
            assert engine.kv_cache_usage()["kv_cache_mirror_bytes"] == mirror
        rows, width = engine.kv_shape
        assert bound is not None and rows * width * per_token + mirror <= bound
        running.append(engine.running_ids)
        step += 1
        assert step < 500
    return got, running


def _cells(tok: Any) -> tuple[list[list[int]], int, int]:
    """The prompts, the longest final length and the longer prompt, checked to fit the bounds below."""
    prompts = [tok.encode(p) for p in PROMPTS]
    final = max(len(p) + n for p, n in zip(prompts, NEWS, strict=True))
    assert final < MIN_WIDTH  # one column bucket all along: the mirror of one row is 1 x MIN_WIDTH cells
    return prompts, final, max(len(p) for p in prompts)


def test_a_request_waits_while_the_running_rows_mirror_takes_its_room(tiny_model: Any) -> None:
    model, tok = tiny_model
    prompts, final, prompt = _cells(tok)
    # room for both requests' cache, not for the second one's cache beside the first one's mirror
    cells = 2 * final + prompt + MIN_WIDTH // 2
    assert cells - final >= MIN_WIDTH  # the first request alone has room for its mirror
    bound = cells * bytes_per_token(model)
    engine = _engine(model, tok, bound)
    got, running = _run(engine, prompts, NEWS, (0, 2))
    assert got == dict(enumerate(generate_tokens(model, prompts, list(NEWS))))
    assert (1,) in running and not any(len(ids) == 2 for ids in running)  # request 1 waited for request 0
    stats = engine.decode_graphs.stats
    assert stats["over_bound_steps"] == 0 and stats["eager_steps"] == 0 and stats["static_steps"] > 0
    assert all(t.is_inference() for t in _mirror_tensors(engine))  # allocated inside the step's inference mode
    # the same bound without graphs: the cache alone fits both requests, which share the batch
    _, shared = _run(_engine(model, tok, bound, graphs=False), prompts, NEWS, (0, 2))
    assert any(len(ids) == 2 for ids in shared)


def test_a_mirror_that_does_not_fit_makes_the_step_dynamic(tiny_model: Any) -> None:
    model, tok = tiny_model
    prompts, final, prompt = _cells(tok)
    cells = 2 * final + 2 * prompt + MIN_WIDTH // 2  # both admitted at once; their 2 x 64 mirror does not fit
    assert cells - 2 * final < 2 * MIN_WIDTH and cells - final >= MIN_WIDTH  # one row's mirror fits
    engine = _engine(model, tok, cells * bytes_per_token(model))
    got, running = _run(engine, prompts, NEWS, (0, 0))
    assert got == dict(enumerate(generate_tokens(model, prompts, list(NEWS))))
    assert (0, 1) in running
    stats = engine.decode_graphs.stats
    # dynamic while both rows run, static once the shorter one has finished
    assert stats["over_bound_steps"] == stats["eager_steps"] > 0 and stats["static_steps"] > 0


def test_a_mirror_left_by_a_finished_batch_gives_way(tiny_model: Any) -> None:
    model, tok = tiny_model
    prompts, final, prompt = _cells(tok)
    bound = (final + prompt + MIN_WIDTH // 2) * bytes_per_token(model)  # one request, or its mirror, not both
    engine = _engine(model, tok, bound)
    engine.decode_graphs.sizes = (4,)  # one row takes a 4 x 64 mirror: allowed under no bound, too big here
    engine.kv_cache_max_bytes = None
    _run_unbounded(engine, prompts[:1], NEWS[:1])
    assert engine.decode_graphs.mirror_bytes() > bound
    engine.kv_cache_max_bytes = bound
    engine.decode_graphs.sizes = (1, 2, 4)
    got, _ = _run(engine, prompts[1:], NEWS[1:], (0,))
    assert got == {0: generate_tokens(model, prompts[1:], list(NEWS[1:]))[0]}
    stats = engine.decode_graphs.stats
    assert stats["mirror_yields"] == 1 and stats["over_bound_steps"] > 0  # a 1 x 64 mirror does not fit either


def _run_unbounded(engine: HFEngine, prompts: list[list[int]], news: tuple[int, ...]) -> dict[int, list[int]]:
    """All requests at once, each released at its ``news[i]`` tokens; the tokens."""
    for i, (ids, n) in enumerate(zip(prompts, news, strict=True)):
        engine.add_request(EngineRequest(i, ids, GenerationParameters(max_new_tokens=n)))
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= news[out.request_id]:
                engine.release(out.request_id)
    return got


def test_a_finished_batch_leaves_no_slab_behind(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = _engine(model, tok, None)
    engine.add_request(EngineRequest(0, tok.encode("Hello there"), GenerationParameters(max_new_tokens=4)))
    slabs: list[weakref.ref[Any]] = []
    for _ in range(4):
        engine.step()
        if engine._batch is not None:
            slabs.append(weakref.ref(engine._batch.layers[0].views()[0].untyped_storage()))
    engine.release(0)
    engine.step()
    gc.collect()
    assert engine.decode_graphs.stats["static_steps"] > 0 and engine.kv_shape == (0, 0)
    assert all(ref() is None for ref in slabs)  # the mirror's record holds no slab of a gone batch


def test_a_mirror_of_another_dtype_is_not_reused(tiny_model: Any) -> None:
    model, tok = tiny_model
    model = copy.deepcopy(model)
    engine = _engine(model, tok, None)
    ids = tok.encode("Deep learning is")
    _run_unbounded(engine, [ids], (6,))
    assert {t.dtype for t in _mirror_tensors(engine)} == {torch.float32}
    model.to(torch.bfloat16)
    _run_unbounded(engine, [ids], (6,))
    assert {t.dtype for t in _mirror_tensors(engine)} == {torch.bfloat16}
    stats = engine.decode_graphs.stats
    assert engine.decode_graphs.disabled is None and stats["eager_steps"] == 0 and stats["mirror_allocations"] == 2


def test_compile_mode_marks_the_buffers_its_step_writes_static(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_batch_size=2)
    engine.use_decode_graphs("compile", (1, 2))
    graphs = engine.decode_graphs
    assert graphs is not None
    ids = tok.encode("Hello there")
    assert _run_unbounded(engine, [ids], (6,)) == {0: generate_tokens(model, [ids], [6])[0]}  # compiled on the CPU
    (bucket,) = graphs._buckets.values()
    inputs = [bucket.ids, bucket.pos, bucket.mask, *bucket.columns,
              *(t for layer in bucket.cache.layers for t in (layer.keys, layer.values))]
    assert all(getattr(t, "_dynamo_static_input_type", None) for t in inputs)
    assert graphs.disabled is None and graphs.stats["static_steps"] == 5


def test_column_buckets_stop_at_the_context_length(tiny_model: Any) -> None:
    model, tok = tiny_model
    assert [width_bucket(n, 80) for n in (1, 64, 65, 80)] == [64, 64, 80, 80]
    assert width_bucket(65) == 128
    ids = tok.encode("Once upon a time")
    new = 80 - len(ids) - 1  # the row's last step fills the context
    engine = HFEngine(model, tok, max_batch_size=2, max_model_len=80)
    engine.use_decode_graphs("static", (1, 2))
    graphs = engine.decode_graphs
    assert graphs is not None
    assert _run_unbounded(engine, [ids], (new,)) == {0: generate_tokens(model, [ids], [new])[0]}
    assert {k.shape[2] for k in graphs.mirror.keys} == {80}  # not 128: no row is wider than the context
    assert graphs.stats["eager_steps"] == 0 and graphs.stats["static_steps"] > 0


def test_the_engine_stats_carry_the_mirror_bytes_to_metrics(tiny_model: Any) -> None:
    from djl_handlers.server.metrics import Metrics

    model, tok = tiny_model
    engine = _engine(model, tok, None)
    assert "kv_cache_mirror_bytes" not in _engine(model, tok, None, graphs=False).kv_cache_usage()
    _run_unbounded(engine, [tok.encode("Hello there")], (3,))
    mirror = sum(t.numel() * t.element_size() for t in _mirror_tensors(engine))
    assert mirror > 0  # kept for the next batch's graphs
    metrics = Metrics("m")
    metrics.engine_stats(engine.kv_cache_usage())
    assert metrics.registry.get_sample_value("djl_handlers_kv_cache_mirror_bytes", {"model": "m"}) == mirror


MANY = ["Hello there", "The capital of France is a city that", "x", "Deep learning is",
        "One two three four five six seven eight nine ten", "a b c", "Once upon a time", "Why"]
MANY_NEWS = (70, 9, 40, 12, 50, 3, 25, 60)


@pytest.mark.parametrize("cells", [160, 300])
def test_rows_joining_in_waves_stay_within_the_bound_and_exact(tiny_model: Any, cells: int) -> None:
    model, tok = tiny_model
    prompts = [tok.encode(p) for p in MANY]
    engine = _engine(model, tok, cells * bytes_per_token(model))
    got, _ = _run(engine, prompts, MANY_NEWS, (0, 0, 0, 9, 9, 20, 30, 31))
    assert got == dict(enumerate(generate_tokens(model, prompts, list(MANY_NEWS))))
    stats = engine.decode_graphs.stats
    # every path taken: static steps, steps whose mirror did not fit, mirrors that gave way to a request
    assert stats["static_steps"] > 0 and stats["over_bound_steps"] > 0 and stats["mirror_yields"] > 0, stats


def test_the_options_together(tiny_dir: Path) -> None:
    from djl_handlers.config.models import ServingConfig

    props = {"model_id": str(tiny_dir), "rolling_batch": "scheduler", "decode_graphs": "static",
             "kv_cache_memory_bytes": "300K"}
    engine = HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))
    assert engine.decode_graphs is not None and engine.kv_cache_max_bytes == 300 * 1024
    ids = engine.tokenizer.encode("Deep learning is")
    got, _ = _run(engine, [ids], (12,), (0,))
    assert got == {0: generate_tokens(engine.model, [ids], [12])[0]}
    usage = engine.kv_cache_usage()
    assert 0 < usage["kv_cache_mirror_bytes"] <= usage["kv_cache_max_bytes"]
