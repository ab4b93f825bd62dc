"""The HF engine's decode step captured as CUDA graphs (``option.decode_graphs=cuda_graphs``) on a
CUDA GPU: replayed steps give the tokens of the dynamic step and of ``generate()`` alone (fp32) while
rows cross row and column buckets, finish mid-bucket and join; each bucket is captured once.

Marked ``gpu``; skipped unless torch sees a CUDA device (``DJL_HANDLERS_TEST_DEVICE=cpu`` runs the
same tests on the CPU with the static-shape step run eagerly, to check the tests themselves). And under a
small ``option.kv_cache_memory_bytes``, with graphs and without: the memory a burst allocates beyond the
model stays within the bound plus a stated activation allowance::

    .venv/bin/python -m pytest -m gpu tests/gpu/test_hf_decode_graphs_cuda.py
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.engines.base import EngineRequest

pytest_plugins = ["conftest_models"]  # fixture: gpu_model_dir

DEVICE = os.environ.get("DJL_HANDLERS_TEST_DEVICE", "cuda")
MODE = "static" if DEVICE == "cpu" else "cuda_graphs"
PROMPTS = ["Deep learning is", "The capital of France is", "Once upon a time, in a small village,", "Why",
           "List three colours:", "def fibonacci(n):", "The history of computing", "Hello"]
NEWS = [80, 12, 40, 5, 33, 70, 20, 9]


def _device_present() -> bool:
    if DEVICE == "cpu":
        return True
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _device_present(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def model_and_tok(gpu_model_dir: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gpu_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(gpu_model_dir), dtype=torch.float32).to(DEVICE).eval()
    return model, tok


def _drive(engine: Any, prompts: list[list[int]], joins: list[int]) -> dict[int, list[int]]:
    from djl_handlers.params.generation import GenerationParameters

    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    step = 0
    while step <= max(joins) or engine.has_unfinished():
        for i, join in enumerate(joins):
            if join == step:
                engine.add_request(EngineRequest(i, prompts[i], GenerationParameters(max_new_tokens=NEWS[i])))
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= NEWS[out.request_id]:
                engine.release(out.request_id)
        step += 1
    return got


def _until_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    """``tokens`` up to and including the first eos (the engine keeps a row going past it; the
    scheduler would stop there)."""
    for i, tok in enumerate(tokens):
        if tok in eos:
            return tokens[: i + 1]
    return tokens


def _alone(model: Any, ids: list[int], n: int, eos: frozenset[int]) -> list[int]:
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=n, do_sample=False)
    return _until_eos([int(t) for t in out[0, len(ids):].tolist()], eos)


@pytest.mark.parametrize("joins", [[0] * 8, [0, 1, 2, 3, 10, 11, 30, 31]])
def test_replayed_graphs_equal_dynamic_steps_and_generate(model_and_tok: Any, joins: list[int]) -> None:
    from djl_handlers.engines.hf.engine import HFEngine

    model, tok = model_and_tok
    prompts = [tok.encode(p) for p in PROMPTS]
    dynamic = _drive(HFEngine(model, tok, max_batch_size=8), prompts, joins)
    engine = HFEngine(model, tok, max_batch_size=8)
    engine.use_decode_graphs(MODE, (1, 2, 4))
    graphs = engine.decode_graphs
    assert graphs is not None
    replayed = _drive(engine, prompts, joins)
    assert graphs.disabled is None, graphs.disabled
    assert replayed == dynamic
    for i, ids in enumerate(prompts):
        eos = engine.eos_token_ids
        assert _until_eos(replayed[i], eos) == _alone(model, ids, NEWS[i], eos), f"request {i}"
    stats = graphs.stats
    assert stats["eager_steps"] == 0 and stats["static_steps"] > 0
    if MODE == "cuda_graphs":
        # one capture per (rows, columns) bucket met, replayed at every other step of that bucket
        assert 0 < stats["captures"] == len(graphs._buckets) < stats["static_steps"]


def test_auto_stays_off_cuda_graphs_are_opt_in_and_enforce_eager_turns_them_off(gpu_model_dir: Path) -> None:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.engine import HFEngine

    def engine(**options: str) -> Any:
        props = {"model_id": str(gpu_model_dir), "rolling_batch": "scheduler", "device": DEVICE, "dtype": "fp32",
                 **options}
        return HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))

    built = engine()
    assert built.decode_graphs is None or built.decode_graphs.mode == "off"
    expected = "off" if DEVICE == "cpu" else "cuda_graphs"
    chosen = engine(decode_graphs="cuda_graphs")
    assert (chosen.decode_graphs.mode if chosen.decode_graphs is not None else "off") == expected
    assert engine(enforce_eager="true").decode_graphs is None


#: The bound of the test below, in cached tokens: a few of the burst's rows at once.
BOUND_TOKENS = 300
BOUND_NEWS = [min(n, 40) for n in NEWS]
#: What the device may allocate beyond the KV bound during the burst: activations (the forward's hidden
#: states, the logits and the sampling's copies of them: rows x vocabulary x 4 bytes a few times), one
#: layer's old slab while it is copied into a larger one, and the graphs' pool with their logits buffer.
ACTIVATION_ALLOWANCE = 64 * 2**20


@pytest.mark.parametrize("graphs", [False, True])
def test_a_small_kv_bound_holds_the_device_memory_of_a_burst(model_and_tok: Any, graphs: bool) -> None:
    """``option.kv_cache_memory_bytes`` small: the burst waits its turn, its tokens equal ``generate()``,
    and the memory the device allocates beyond the model stays within the bound plus the activation
    allowance (on CUDA ``max_memory_allocated``; on the CPU the slab tensors' and the mirror's bytes
    after every step, spare rows and columns included)."""
    import torch

    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.engines.hf.kv_budget import bytes_per_token
    from djl_handlers.params.generation import GenerationParameters

    model, tok = model_and_tok
    prompts = [tok.encode(p) for p in PROMPTS]
    bound = BOUND_TOKENS * bytes_per_token(model)
    cuda = DEVICE.startswith("cuda")
    warm = HFEngine(model, tok, max_batch_size=8)  # cuBLAS workspaces, kernels: not the burst's memory
    if graphs:
        warm.use_decode_graphs(MODE, (1, 2, 4, 8))
    _drive(warm, prompts[:2], [0, 0])
    del warm
    gc.collect()  # the warm engine and its graphs reference each other
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = int(torch.cuda.memory_allocated()) if cuda else 0
    engine = HFEngine(model, tok, max_batch_size=8, kv_cache_max_bytes=bound)
    if graphs:
        engine.use_decode_graphs(MODE, (1, 2, 4, 8))
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(i, ids, GenerationParameters(max_new_tokens=BOUND_NEWS[i])))
    widest, steps = 0, 0
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= BOUND_NEWS[out.request_id]:
                engine.release(out.request_id)
        usage = engine.kv_cache_usage()
        held = usage["kv_cache_capacity_bytes"] + usage.get("kv_cache_mirror_bytes", 0)
        assert held <= bound, (steps, held, bound)
        widest = max(widest, len(engine.running_ids))
        steps += 1
    if cuda:  # read before generate() below allocates its own cache
        torch.cuda.synchronize()
        grown = int(torch.cuda.max_memory_allocated()) - base
        assert grown <= bound + ACTIVATION_ALLOWANCE, (grown, bound)
    assert engine.slabs.over_bound == 0 and 1 < widest < len(prompts)  # rows shared the batch, within the bound
    for i, ids in enumerate(prompts):
        eos = engine.eos_token_ids
        assert _until_eos(got[i], eos) == _alone(model, ids, BOUND_NEWS[i], eos), f"request {i}"
    if graphs:
        assert engine.decode_graphs is not None and engine.decode_graphs.stats["static_steps"] > 0
