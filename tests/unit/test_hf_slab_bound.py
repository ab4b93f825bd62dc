"""The KV slabs' *allocated* capacity under ``option.kv_cache_memory_bytes``: rows join (in groups, in
chunks, as several samples of one prompt), grow and leave under a tight bound, with and without the
decode graphs' mirror; at every allocation and after every step the slabs' tensors (spare rows and
columns included) plus the mirror stay within the bound, the greedy tokens equal ``generate()``, and
the engine admits exactly what it admits with unbounded slabs (whose capacity goes far past the bound).
Then the ledger on hand-made slabs: spare cut to the room, other slabs' spare given back, an overrun
counted; and no bound: the shapes as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import generate_tokens  # noqa: E402

from djl_handlers.engines.base import EngineRequest  # noqa: E402
from djl_handlers.engines.hf.batch import GROW, SlabLayer, new_slab_cache  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.engines.hf.kv_budget import bytes_per_token  # noqa: E402
from djl_handlers.engines.hf.slab_ledger import SlabGroup, SlabLedger  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]

PROMPTS = ["Hello there", "The capital of France is a city that", "x", "Deep learning is",
           "One two three four five six seven eight nine ten eleven twelve thirteen", "a b c", "Once upon a time",
           "Why"]
NEWS = (40, 9, 30, 12, 20, 3, 25, 35)
JOINS = (0, 0, 1, 6, 9, 20, 21, 30)
SAMPLED = 3  # this request asks for 2 samples (n=2): its prompt is prefilled once, its KV row forked
CELLS = 150  # the bound in cached tokens: a few rows at once, far below what unbounded slabs allocate


def _slab_tensors(engine: HFEngine) -> Iterator[torch.Tensor]:
    """The slab tensors alive between steps: the running batch's and a chunk-prefilled prompt's."""
    caches = [engine._batch.cache] if engine._batch is not None else []
    caches += [engine._partial.cache] if engine._partial is not None else []
    for cache in caches:
        for layer in cache.layers:
            if layer._k is not None:
                yield from (layer._k, layer._v)


def _mirror_bytes(engine: HFEngine) -> int:
    graphs = engine.decode_graphs
    return sum(t.numel() * t.element_size() for t in (*graphs.mirror.keys, *graphs.mirror.values)) if graphs else 0


def _params(i: int) -> GenerationParameters:
    if i == SAMPLED:
        return GenerationParameters(max_new_tokens=NEWS[i], do_sample=True, seed=7, n=2)
    return GenerationParameters(max_new_tokens=NEWS[i])


def _run(engine: HFEngine, prompts: list[list[int]], bound: int | None
         ) -> tuple[dict[int, list[int]], list[tuple[int, ...]], int]:
    """Add request ``i`` at step ``JOINS[i]`` (request ``SAMPLED`` with a second sample, id 100), release
    each at its ``NEWS`` tokens; the tokens, the running ids of each step and the largest capacity seen.
    With ``bound``: after every step the slab tensors plus the mirror are within it, and the ledger
    counts exactly those tensors."""
    limits = {i: NEWS[i] for i in range(len(prompts))} | {100: NEWS[SAMPLED]}
    got: dict[int, list[int]] = {i: [] for i in limits}
    running: list[tuple[int, ...]] = []
    peak, step = 0, 0
    while step <= max(JOINS) or engine.has_unfinished():
        for i, join in enumerate(JOINS):
            if join == step:
                samples = (100,) if i == SAMPLED else ()
                engine.add_request(EngineRequest(i, prompts[i], _params(i), sample_ids=samples))
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= limits[out.request_id]:
                engine.release(out.request_id)
        allocated = sum(t.numel() * t.element_size() for t in _slab_tensors(engine))
        peak = max(peak, allocated + _mirror_bytes(engine))
        if bound is not None:
            assert engine.slabs.capacity() == allocated == engine.kv_cache_usage()["kv_cache_capacity_bytes"]
            assert allocated + _mirror_bytes(engine) <= bound, (step, allocated, _mirror_bytes(engine))
        running.append(engine.running_ids)
        step += 1
        assert step < 1000
    return got, running, peak


@pytest.fixture
def checked_allocations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every slab allocation (``adopt``, reallocation) records its ledger's capacity plus mirror and limit."""
    seen: list[tuple[int, int]] = []
    for name in ("adopt", "_realloc"):
        original = getattr(SlabLayer, name)

        def wrapped(self: SlabLayer, *args: Any, _original: Any = original, **kwargs: Any) -> None:
            _original(self, *args, **kwargs)
            ledger = self.ledger
            if ledger is not None and ledger.limit is not None:
                seen.append((ledger.capacity() + ledger.mirror_bytes, ledger.limit))

        monkeypatch.setattr(SlabLayer, name, wrapped)
    return seen


def _engine(model: Any, tok: Any, bound: int, graphs: bool, capped: bool) -> HFEngine:
    engine = HFEngine(model, tok, max_batch_size=8, max_prefill_tokens=8, kv_cache_max_bytes=bound)
    if graphs:
        engine.use_decode_graphs("static", (1, 2, 4, 8))
    if not capped:  # the slabs as before: same admission, spare room taken without asking the bound
        engine._new_cache = lambda: new_slab_cache(model.config)  # type: ignore[method-assign]
    return engine


@pytest.mark.parametrize("graphs", [False, True])
def test_allocated_capacity_stays_within_the_bound_with_the_same_admissions_and_tokens(
        tiny_model: Any, checked_allocations: list[tuple[int, int]], graphs: bool) -> None:
    model, tok = tiny_model
    prompts = [tok.encode(p) for p in PROMPTS]
    assert len(prompts[4]) > 8  # prefilled in chunks (max_prefill_tokens=8)
    bound = CELLS * bytes_per_token(model)
    engine = _engine(model, tok, bound, graphs, capped=True)
    got, running, peak = _run(engine, prompts, bound)
    greedy = [i for i in range(len(prompts)) if i != SAMPLED]
    want = generate_tokens(model, [prompts[i] for i in greedy], [NEWS[i] for i in greedy])
    assert {i: got[i] for i in greedy} == dict(zip(greedy, want, strict=True))
    assert checked_allocations and all(used <= limit for used, limit in checked_allocations)
    assert engine.slabs.over_bound == 0 and peak <= bound and engine.slabs.compactions > 0  # spare given back
    assert any(len(ids) >= 3 for ids in running)  # the bound is tight, not tiny: rows share the batch

    free = _engine(model, tok, bound, graphs, capped=False)
    free_got, free_running, free_peak = _run(free, prompts, None)
    assert free_running == running and free_got == got  # the same admissions, the same tokens (samples too)
    assert free_peak > 2 * bound  # what the cap prevents: unbounded spare room
    if graphs:
        assert engine.decode_graphs.stats["static_steps"] > 0
        assert engine.decode_graphs.stats["over_bound_steps"] == free.decode_graphs.stats["over_bound_steps"]


def _layer(ledger: SlabLedger | None, rows: int, width: int, group: SlabGroup | None = None) -> SlabLayer:
    """A one-layer slab of ``rows`` x ``width`` cells of 8 bytes (keys and values of one float32 each)."""
    layer = SlabLayer(ledger, group)
    keys = torch.arange(float(rows * width)).view(rows, 1, width, 1)
    layer.adopt(keys, -keys)
    return layer


def test_spare_room_is_cut_to_what_the_bound_leaves() -> None:
    ledger = SlabLedger(limit=8 * 100)  # 100 cells
    layer = _layer(ledger, 2, 10)
    assert layer._k.shape == (2, 1, 50, 1) and ledger.capacity() == 800  # GROW cut to 40 spare columns
    new = torch.ones(2, 1, 40, 1)
    layer.update(new, -new)  # fills the spare exactly: no reallocation
    assert layer._k.shape[2] == 50
    layer.update(new[:, :, :1], -new[:, :, :1])  # one more column than the bound holds: overrun, counted
    assert ledger.over_bound == 1 and layer.keys.shape[2] == 51
    unbounded = _layer(None, 2, 10)
    assert unbounded._k.shape == (2, 1, 10 + GROW, 1)  # no ledger: as before


def test_other_slabs_give_their_spare_back_for_a_need() -> None:
    ledger = SlabLedger(limit=8 * 300)
    first = _layer(ledger, 1, 10)  # takes 138 cells (GROW spare)
    assert first._k.shape[2] == 10 + GROW
    second = _layer(ledger, 2, 60, SlabGroup(1))  # needs 120 cells: fits beside, spare cut to 162 - 120
    assert second._k.shape == (2, 1, 81, 1)
    third = _layer(ledger, 1, 100, SlabGroup(1))  # needs 100 cells: the others give their spare back
    assert ledger.compactions == 1 and ledger.over_bound == 0
    assert first._k.shape[2] == 10 and second._k.shape[2] == 60 and third._k.shape[2] >= 100
    assert ledger.capacity() <= 8 * 300
    assert first.keys[0, 0, :, 0].tolist() == [float(c) for c in range(10)]  # the content moved intact
    ledger.mirror_bytes = 8 * 100  # the mirror's room counts too: a need beside it overruns
    _layer(ledger, 1, 40, SlabGroup(1))
    assert ledger.over_bound == 1
