"""``option.kv_cache_dtype``: a 16-bit KV cache under fp32 weights on the HF engine.

What is checked: the option's values (vLLM's names and the short ones, fp8 refused by name); where a
16-bit cache is refused at load (16-bit weights, attention other than the ragged CPU kernel); that the
slabs really hold 16-bit keys and values and count half the bytes per token; that the served tokens
agree with fp32's as documented (teacher-forced over fp32's greedy text: the same argmax wherever fp32's
two best logits are :data:`engine_runs.AGREEMENT_GAP` apart); that a row's tokens do not depend on its
batch; that the dynamic batch (``generate()``) fills the same 16-bit cache and gives the rolling batch's tokens; and the
SDPA fallback for masks the kernel does not take.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import AGREEMENT_PROMPTS as PROMPTS  # noqa: E402
from engine_runs import decided_agreement  # noqa: E402

from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.engines.base import EngineRequest  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import ConfigError  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]
KINDS = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _hf(**options: str) -> Any:
    return ServingConfig.from_properties({"rolling_batch": "scheduler", **options}, engine="huggingface").hf


@pytest.mark.parametrize(("value", "want"), [(None, "auto"), ("auto", "auto"), ("float16", "float16"),
                                             ("FP16", "float16"), ("bfloat16", "bfloat16"), ("bf16", "bfloat16")])
def test_the_option_takes_vllms_names_and_the_short_ones(value: str | None, want: str) -> None:
    assert _hf(**({"kv_cache_dtype": value} if value is not None else {})).kv_cache_dtype == want


@pytest.mark.parametrize(("value", "words"), [("fp8", "fp8 KV caches are vLLM's"), ("fp8_e4m3", "16 or 32 bits"),
                                              ("int8", "auto, float16 (fp16) or bfloat16 (bf16)")])
def test_other_values_are_refused_naming_the_option(value: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _hf(kv_cache_dtype=value)
    assert err.value.field == "option.kv_cache_dtype" and words in str(err.value)


@functools.cache
def _engine(path: Path, kv: str = "auto", dtype: str = "fp32", **extra: str) -> HFEngine:
    config = ServingConfig.from_properties({"model_id": str(path), "dtype": dtype, "rolling_batch": "scheduler",
                                            "kv_cache_dtype": kv, "cpu_threads": "fixed", **extra},
                                           engine="huggingface")
    return HFEngine.from_config(config)


def _greedy(engine: HFEngine, prompts: list[list[int]], new: int, together: bool = True) -> list[list[int]]:
    """Greedy tokens of each prompt through ``engine``'s rolling batch (all at once, or each alone);
    checks at every step that the running slabs hold the engine's KV type."""
    got: dict[int, list[int]] = {}
    groups = [list(range(len(prompts)))] if together else [[i] for i in range(len(prompts))]
    for group in groups:
        for i in group:
            got[i] = []
            engine.add_request(EngineRequest(1000 + i, prompts[i], GenerationParameters(max_new_tokens=new)))
        while engine.has_unfinished():
            for out in engine.step():
                assert out.error is None, out.error
                got[out.request_id - 1000].append(int(out.token_id))
                if len(got[out.request_id - 1000]) >= new:
                    engine.release(out.request_id)
            batch = engine._batch
            if batch is not None and batch.rows:
                keys, values = batch.layers[0].views()
                want = engine.kv_dtype or torch.float32
                assert keys.dtype == want and values.dtype == want
    return [got[i] for i in range(len(prompts))]


def test_a_16_bit_cache_is_refused_where_it_cannot_apply(tiny_dir: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _engine(tiny_dir, "float16", "fp32", cpu_attention="sdpa")
    assert err.value.field == "option.kv_cache_dtype" and "ragged attention kernel" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _engine(tiny_dir, "float16", "bf16")
    assert "under fp32 weights only" in str(err.value)
    assert _engine(tiny_dir, "bfloat16", "bf16").kv_dtype is None  # the model's own type: nothing to change


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_slabs_hold_16_bit_keys_and_count_half_the_bytes(tiny_dir: Path, kind: str) -> None:
    fp32, low = _engine(tiny_dir), _engine(tiny_dir, kind)
    assert low.kv_dtype == KINDS[kind] and fp32.kv_dtype is None
    assert low.kv_bytes_per_token * 2 == fp32.kv_bytes_per_token
    assert low.kv_cache_usage()["kv_cache_dtype"] == kind
    tok = low.tokenizer
    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    _greedy(low, prompts, 6)  # asserts the slab's type at every step
    for rid in range(3):
        low.add_request(EngineRequest(2000 + rid, prompts[rid], GenerationParameters(max_new_tokens=4)))
    low.step()
    assert low._batch is not None
    used, _ = low._batch.kv_bytes()
    assert used == int(low._batch.mask.sum()) * low.kv_bytes_per_token  # the real tokens' cells, 16-bit each
    for rid in range(3):
        low.release(2000 + rid)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_16_bit_kv_greedy_agrees_with_fp32_where_fp32_is_decided(embedded_dir: Path, kind: str) -> None:
    """Teacher-forced over fp32's greedy text: one forward per prompt over a 16-bit slab (the keys and
    values rounded before the model attends to them, as in serving)."""
    from djl_handlers.engines.hf.batch import new_slab_cache

    engine = _engine(embedded_dir)
    model, tok = engine.model, engine.tokenizer
    decided = differing = 0
    for text in PROMPTS:
        ids = tok.encode(text)
        with torch.inference_mode():
            seq = model.generate(torch.tensor([ids]), max_new_tokens=20, min_new_tokens=20, do_sample=False)
            want = model(seq).logits[0, len(ids) - 1:-1]
            cache = new_slab_cache(model.config, None, KINDS[kind])
            got = model(seq, use_cache=True, **{engine._cache_kw: cache}).logits[0, len(ids) - 1:-1]
            assert cache.layers[0].keys.dtype == KINDS[kind]
        clear, differ = decided_agreement(want, got, text)
        assert not torch.equal(want, got)  # the cache really was 16-bit
        decided += clear
        differing += differ
    assert decided >= len(PROMPTS) * 20 // 3
    assert differing <= len(PROMPTS) * 20 // 10


def test_a_rows_tokens_do_not_depend_on_its_batch_and_generate_gives_the_same(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from djl_handlers.engines.hf.cpu import ragged_attention

    def no_sdpa(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the kernel should read the 16-bit cache itself")

    monkeypatch.setattr(ragged_attention, "_sdpa", no_sdpa)
    engine = _engine(tiny_dir, "float16")
    tok = engine.tokenizer
    prompts = [tok.encode(text) for text in PROMPTS]
    together = _greedy(engine, prompts, 8)
    alone = _greedy(engine, prompts, 8, together=False)
    assert together == alone
    # the dynamic batch: generate() over the same 16-bit slab, one padded group
    requests = [EngineRequest(3000 + i, ids, GenerationParameters(max_new_tokens=8)) for i, ids in enumerate(prompts)]
    static = engine.generate_static(requests)
    assert [[int(o.token_id) for o in outs] for outs in static] == together


def test_masks_the_kernel_does_not_take_fall_back_to_sdpa_on_widened_keys() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from djl_handlers.engines.hf.cpu.ragged_attention import ragged_attention

    class Layer(torch.nn.Module):
        is_causal = True
        num_key_value_groups = 3

    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 6, 4, 32, generator=gen)
    key = torch.randn(2, 2, 4, 32, generator=gen).to(torch.float16)
    value = torch.randn(2, 2, 4, 32, generator=gen).to(torch.float16)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)  # not causal: the kernel does not take it
    out, _ = ragged_attention(Layer(), query, key, value, mask)
    want, _ = sdpa_attention_forward(Layer(), query, key.float(), value.float(), mask)
    assert out.dtype == torch.float32 and torch.allclose(out, want, atol=1e-6)
