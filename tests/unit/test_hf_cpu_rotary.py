"""``option.cpu_rotary``: rotary embedding in one C call, bitwise torch's (kernels/rotary.py,
engines/hf/cpu/rotary.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import engine_tokens, generate_tokens  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from djl_handlers.engines.hf.cpu import rotary  # noqa: E402
from djl_handlers.engines.hf.cpu.rotary import FastRotary, disable, enable, matches  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.kernels import rotary as kernel  # noqa: E402

pytest_plugins = ["conftest_models"]
pytestmark = pytest.mark.skipif(not kernel.available(), reason=f"kernel not built: {kernel.unavailable_reason()}")
DTYPES = [torch.float32, torch.bfloat16]


def _original() -> Any:
    fn = modeling_llama.apply_rotary_pos_emb
    return fn.original if isinstance(fn, FastRotary) else fn


def _inputs(dtype: Any, batch: int, seq: int, heads: int, kv: int, dim: int, strided: bool, cs_batch: int,
            seed: int = 0) -> tuple[Any, Any, Any, Any]:
    gen = torch.Generator().manual_seed(seed)
    # slices of one fused projection output, as the fused projections (engines/hf/cpu/fused.py) hand them over
    if strided:
        fused = torch.randn(batch, seq, (heads + 2 * kv) * dim, generator=gen).to(dtype)
        q = fused[..., : heads * dim].view(batch, seq, heads, dim).transpose(1, 2)
        k = fused[..., heads * dim: (heads + kv) * dim].view(batch, seq, kv, dim).transpose(1, 2)
    else:
        q = torch.randn(batch, heads, seq, dim, generator=gen).to(dtype)
        k = torch.randn(batch, kv, seq, dim, generator=gen).to(dtype)
    angles = torch.rand(cs_batch, seq, dim, generator=gen) * 50
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize(("batch", "seq", "heads", "kv", "dim", "cs_batch"), [
    (1, 1, 1, 1, 2, 1), (32, 1, 9, 3, 64, 32), (1, 512, 9, 3, 64, 1), (4, 37, 8, 8, 128, 4), (2, 3, 4, 2, 80, 1),
])
def test_the_kernel_gives_torchs_bits(dtype: Any, strided: bool, batch: int, seq: int, heads: int, kv: int,
                                      dim: int, cs_batch: int) -> None:
    q, k, cos, sin = _inputs(dtype, batch, seq, heads, kv, dim, strided, cs_batch)
    want = _original()(q, k, cos, sin)
    got = kernel.rotary(q, k, cos, sin)
    assert got is not None
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == dtype and a.is_contiguous()
        assert torch.equal(a, b)


def test_positions_are_independent() -> None:
    q, k, cos, sin = _inputs(torch.float32, 6, 9, 4, 2, 64, True, 6)
    whole = kernel.rotary(q, k, cos, sin)
    part = kernel.rotary(q[2:3], k[2:3], cos[2:3], sin[2:3])
    assert whole is not None and part is not None
    assert torch.equal(part[0], whole[0][2:3]) and torch.equal(part[1], whole[1][2:3])


def test_calls_outside_the_kernel_are_refused() -> None:
    q, k, cos, sin = _inputs(torch.float32, 2, 3, 4, 2, 64, False, 2)
    assert kernel.rotary(q.double(), k.double(), cos.double(), sin.double()) is None
    assert kernel.rotary(q, k, cos.bfloat16(), sin.bfloat16()) is None  # mixed dtypes
    assert kernel.rotary(q[..., :63], k[..., :63], cos[..., :63], sin[..., :63]) is None  # odd head dim
    assert kernel.rotary(q, k, cos[:1, :2], sin[:1, :2]) is None  # wrong length
    assert kernel.rotary(q.transpose(2, 3), k.transpose(2, 3), cos, sin) is None  # head dim not unit stride
    assert kernel.rotary(q, k, cos.unsqueeze(1), sin.unsqueeze(1)) is None  # already unsqueezed


def test_fast_rotary_falls_back_for_other_calls() -> None:
    calls: list[Any] = []

    def original(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:
        calls.append(unsqueeze_dim)
        return _original()(q, k, cos, sin, unsqueeze_dim)

    fast = FastRotary(original)
    q, k, cos, sin = _inputs(torch.float32, 2, 3, 4, 2, 64, False, 2)
    out = fast(q, k, cos, sin)
    assert calls == [] and torch.equal(out[0], _original()(q, k, cos, sin)[0])
    fast(q, k, cos, sin, unsqueeze_dim=1)
    fast(q, k, cos, sin, 1)
    assert calls == []
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # [B, S, H, D] layout: unsqueeze_dim=2
    fast(qt, kt, cos, sin, unsqueeze_dim=2)
    fast(q.double(), k.double(), cos.double(), sin.double())
    assert calls == [2, 1]


def test_a_different_formula_is_not_replaced() -> None:
    def interleaved(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:  # GPT-J style
        return q * cos.unsqueeze(1), k * cos.unsqueeze(1)

    assert matches(_original(), torch.float32) and matches(_original(), torch.bfloat16)
    assert not matches(interleaved, torch.float32)


def test_enable_and_disable_on_a_llama_model(tiny_model: Any) -> None:
    model, tok = tiny_model
    modeling_llama.apply_rotary_pos_emb = _original()  # another test's engine may have installed it
    ids = torch.tensor([tok.encode("The capital of France is a city that")])
    with torch.inference_mode():
        want = model(ids).logits
        assert enable(model) == 1
        assert isinstance(modeling_llama.apply_rotary_pos_emb, FastRotary)
        got = model(ids).logits
        assert enable(model) == 1 and not isinstance(modeling_llama.apply_rotary_pos_emb.original, FastRotary)
    try:
        assert torch.equal(got, want)  # bitwise: the same logits with and without the kernel
    finally:
        assert disable(model) == 1
    assert not isinstance(modeling_llama.apply_rotary_pos_emb, FastRotary)


def test_engine_with_the_kernel_equals_generate_alone(tiny_model: Any) -> None:
    model, tok = tiny_model
    prompts = [tok.encode(p) for p in ("Hello there", "x", "One two three four five six seven eight")]
    news = [6, 8, 5]
    modeling_llama.apply_rotary_pos_emb = _original()
    assert enable(model) == 1
    try:
        got = engine_tokens(model, tok, prompts, news)
    finally:
        disable(model)
    want = generate_tokens(model, prompts, news)  # the reference runs on torch's rotary
    assert [got[i][:n] for i, n in enumerate(news)] == want



@pytest.mark.parametrize(("value", "installed"), [(None, True), ("torch", False)])
def test_the_hf_engine_uses_the_kernel_by_default(tiny_dir: Any, value: str | None, installed: bool) -> None:
    from djl_handlers.config.models import ServingConfig

    modeling_llama.apply_rotary_pos_emb = _original()  # another test's engine may have installed it
    options = {"model_id": str(tiny_dir), "rolling_batch": "auto", **({"cpu_rotary": value} if value else {})}
    engine = HFEngine.from_config(ServingConfig.from_properties(options, engine="huggingface"))
    try:
        assert isinstance(modeling_llama.apply_rotary_pos_emb, FastRotary) == installed
    finally:
        rotary.disable(engine.model)
