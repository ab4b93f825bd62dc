"""``option.cpu_norm``: the fused RMSNorm kernel (kernels/rms_norm.*), its module replacement
(engines/hf/cpu/norm.py) and the loader's switch."""

from __future__ import annotations

import copy
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import engine_tokens, generate_tokens  # noqa: E402
from torch import nn  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

from djl_handlers.engines.hf.cpu.norm import FusedRMSNorm, fuse_rms_norms, matches, unfuse_rms_norms  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.kernels import build  # noqa: E402
from djl_handlers.kernels import rms_norm as kernel  # noqa: E402

pytest_plugins = ["conftest_models"]
needs_kernel = pytest.mark.skipif(not kernel.available(), reason=f"kernel unavailable: {kernel.unavailable_reason()}")

Tensor = Any
DTYPES = [torch.float32, torch.bfloat16]


def _inputs(rows: int, hidden: int, dtype: Any, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Rows at very different scales (so eps matters for some) and a random weight."""
    gen = torch.Generator().manual_seed(seed * 7919 + rows * 31 + hidden)
    scales = torch.logspace(-3, 2, rows).reshape(rows, 1)
    x = (torch.randn(rows, hidden, generator=gen) * scales).to(dtype)
    weight = (torch.randn(hidden, generator=gen) * 0.5 + 1).to(dtype)
    return x, weight


def _norms(model: Any) -> list[Any]:
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


# ---------------------------------------------------------------------------------------------
# 1. the kernel against torch's formula


@needs_kernel
def test_the_summation_width_is_found() -> None:
    assert kernel.lanes() in (4, 8, 16)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 576, 2048, 100])
@pytest.mark.parametrize("rows", [1, 3, 32, 600])
def test_kernel_equals_llama_rms_norm_bit_for_bit(dtype: Any, hidden: int, rows: int) -> None:
    x, weight = _inputs(rows, hidden, dtype)
    module = LlamaRMSNorm(hidden, eps=1e-5).to(dtype)
    with torch.no_grad():
        module.weight.copy_(weight)
        want = module(x)
    got = kernel.rms_norm(x, weight, 1e-5)
    assert got is not None and got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    # and the formula is the one intended (float64 ground truth), not only torch's bits
    x64 = x.double()
    exact = weight.double() * (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol * 1e-2)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 5, 7, 8, 9, 17, 63, 4099])
def test_odd_widths_match_too(dtype: Any, hidden: int) -> None:
    for rows in (1, 4):
        x, weight = _inputs(rows, hidden, dtype, seed=3)
        got = kernel.rms_norm(x, weight, 1e-6)
        assert got is not None and torch.equal(got, kernel.reference(x, weight, 1e-6))


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_gets_the_same_bits_alone_as_in_any_batch(dtype: Any) -> None:
    x, weight = _inputs(64, 576, dtype, seed=1)
    batch = kernel.rms_norm(x, weight, 1e-5)
    assert batch is not None
    for i in (0, 17, 63):
        alone = kernel.rms_norm(x[i : i + 1], weight, 1e-5)
        assert alone is not None and torch.equal(alone[0], batch[i])
    threaded = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = kernel.rms_norm(x, weight, 1e-5)
    finally:
        torch.set_num_threads(threaded)
    assert single is not None and torch.equal(single, batch)


@needs_kernel
def test_shapes_and_strided_inputs() -> None:
    x, weight = _inputs(24, 96, torch.float32, seed=2)
    want = kernel.reference(x, weight, 1e-6)
    three_d = kernel.rms_norm(x.reshape(2, 12, 96), weight, 1e-6)
    assert three_d is not None and three_d.shape == (2, 12, 96) and torch.equal(three_d.reshape(24, 96), want)
    wide = torch.zeros(24, 200)
    wide[:, 50:146] = x
    view = wide[:, 50:146]  # rows strided, last dim contiguous: copied first
    got = kernel.rms_norm(view, weight, 1e-6)
    assert got is not None and got.is_contiguous() and torch.equal(got, want)
    transposed = kernel.rms_norm(x.t().contiguous().t(), weight, 1e-6)  # last dim not contiguous: copied
    assert transposed is not None and torch.equal(transposed, want)
    empty = kernel.rms_norm(torch.empty(0, 96), weight, 1e-6)
    assert empty is not None and empty.shape == (0, 96)


@needs_kernel
def test_zero_rows_and_large_values_follow_torch() -> None:
    x, weight = _inputs(4, 64, torch.float32)
    x[0] = 0.0  # 0 * rsqrt(eps)
    x[1, 3] = 1e20  # the square overflows to inf: torch gives 0 or nan, the kernel the same
    got = kernel.rms_norm(x, weight, 1e-6)
    assert got is not None
    torch.testing.assert_close(got, kernel.reference(x, weight, 1e-6), equal_nan=True, rtol=0, atol=0)


@needs_kernel
def test_inputs_outside_the_kernel_are_refused() -> None:
    x, weight = _inputs(4, 64, torch.float32)
    assert kernel.rms_norm(x.half(), weight.half(), 1e-6) is None  # fp16
    assert kernel.rms_norm(x.bfloat16(), weight, 1e-6) is None  # dtype mismatch
    assert kernel.rms_norm(x, weight[:32], 1e-6) is None  # width mismatch
    assert kernel.rms_norm(x, weight.reshape(8, 8), 1e-6) is None  # 2-D weight
    assert kernel.rms_norm(x.to("meta"), weight.to("meta"), 1e-6) is None  # not on the CPU
    assert kernel.rms_norm(x.requires_grad_(), weight, 1e-6) is None  # autograd
    with torch.no_grad():
        assert kernel.rms_norm(x, weight, 1e-6) is not None


@needs_kernel
def test_the_kernel_is_built_without_fast_math(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """-ffast-math would let the compiler reorder the sums and use rsqrt approximations, and FMA
    contraction would fuse x*x+acc: the kernel's own flags come after each flag set."""
    commands: list[list[str]] = []
    real_run = subprocess.run

    def run(cmd: list[str], *args: Any, **kwargs: Any) -> Any:
        commands.append(cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(build.subprocess, "run", run)
    monkeypatch.setenv("DJL_HANDLERS_KERNEL_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(kernel, "_fn", None)
    assert kernel.library() is not None
    (compile_cmd,) = [c for c in commands if "-c" in c]
    assert compile_cmd.index("-fno-fast-math") > compile_cmd.index("-ffast-math")
    assert "-ffp-contract=off" in compile_cmd
    (link_cmd,) = [c for c in commands if "-shared" in c]
    assert "-ffast-math" not in link_cmd
    x, weight = _inputs(5, 576, torch.float32)
    got = kernel.rms_norm(x, weight, 1e-6)  # the freshly built library
    assert got is not None and torch.equal(got, kernel.reference(x, weight, 1e-6))


# ---------------------------------------------------------------------------------------------
# 2. module replacement


class GemmaStyleRMSNorm(LlamaRMSNorm):
    """Gemma's variant: fp32 product with (1 + weight), rounded once at the end."""

    def forward(self, hidden_states: Tensor) -> Tensor:
        x = hidden_states.float()
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (y * (1.0 + self.weight.float())).type_as(hidden_states)


class BiasedRMSNorm(nn.Module):
    """A custom norm with Llama's attributes plus a bias."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.bias = torch.nn.Parameter(torch.full((hidden,), 0.25))
        self.eps = 1e-6

    def forward(self, x: Tensor) -> Tensor:
        return kernel.reference(x, self.weight, self.eps) + self.bias


class PlainRMSNorm(nn.Module):
    """Not from transformers, but Llama's formula with an ``eps`` attribute: fused."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden))
        self.eps = 1e-5

    def forward(self, x: Tensor) -> Tensor:
        return kernel.reference(x, self.weight, self.eps)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_only_modules_with_llama_formula_are_fused(dtype: Any) -> None:
    model = torch.nn.ModuleDict({
        "llama": LlamaRMSNorm(64, eps=1e-5), "gemma": GemmaStyleRMSNorm(64), "biased": BiasedRMSNorm(64),
        "plain": PlainRMSNorm(64), "layer_norm": torch.nn.LayerNorm(64),
    }).to(dtype)
    with torch.no_grad():
        model["llama"].weight.normal_()
        model["gemma"].weight.normal_()
    assert fuse_rms_norms(model) == 2
    fused = {name for name, m in model.items() if isinstance(m.__dict__.get("forward"), FusedRMSNorm)}
    assert fused == {"llama", "plain"}
    assert fuse_rms_norms(model) == 0  # already fused
    assert unfuse_rms_norms(model) == 2
    assert all("forward" not in m.__dict__ for m in model.values())


@needs_kernel
def test_fp16_norms_are_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    norm = LlamaRMSNorm(64).half()
    with caplog.at_level(logging.DEBUG):  # patches.apply reports it at INFO, once
        assert fuse_rms_norms(torch.nn.Sequential(norm)) == 0
    assert "forward" not in norm.__dict__ and "LlamaRMSNorm (torch.float16, cpu)" in caplog.text


@needs_kernel
def test_the_real_gemma_norm_is_rejected() -> None:
    gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    norm = gemma.GemmaRMSNorm(64, eps=1e-6)
    assert not matches(norm, norm.forward, 1e-6)  # zero weight: Gemma scales by 1, Llama by 0
    with torch.no_grad():
        norm.weight.normal_()
    assert not matches(norm, norm.forward, 1e-6)
    assert fuse_rms_norms(torch.nn.Sequential(norm)) == 0


@needs_kernel
def test_a_fused_norm_falls_back_for_what_the_kernel_refuses() -> None:
    norm = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    assert fuse_rms_norms(torch.nn.Sequential(norm)) == 1
    x, _ = _inputs(4, 64, torch.float32)
    with torch.no_grad():
        stock = LlamaRMSNorm.forward(norm, x)
        assert torch.equal(norm(x), stock)
        # a bf16 input to an fp32 norm: torch promotes (weight fp32 * y bf16 -> fp32); so does the fallback
        mixed = norm(x.bfloat16())
        assert mixed.dtype == torch.float32 and torch.equal(mixed, LlamaRMSNorm.forward(norm, x.bfloat16()))
    # autograd: the original forward runs and the graph is kept
    out = norm(x.clone().requires_grad_())
    assert out.grad_fn is not None
    out.sum().backward()
    assert norm.weight.grad is not None
    unfuse_rms_norms(norm)


@needs_kernel
def test_fusing_keeps_modules_weights_and_hooks(tiny_model: Any) -> None:
    model, _ = tiny_model
    keys = list(model.state_dict())
    norms = _norms(model)
    seen: list[int] = []
    handle = norms[0].register_forward_hook(lambda _m, _i, out: seen.append(out.shape[-1]))
    try:
        assert fuse_rms_norms(model) == len(norms) == 2 * model.config.num_hidden_layers + 1
        assert list(model.state_dict()) == keys
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]))
        assert seen == [model.config.hidden_size]
    finally:
        handle.remove()
        assert unfuse_rms_norms(model) == len(norms)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_engine_with_fused_norms_equals_generate_and_the_stock_model(tiny_model: Any, dtype: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    base, tok = tiny_model
    calls = {"kernel": 0, "refused": 0}
    real = kernel.rms_norm

    def counting(x: Tensor, weight: Tensor, eps: float) -> Tensor | None:
        out = real(x, weight, eps)
        calls["kernel" if out is not None else "refused"] += 1
        return out

    monkeypatch.setattr(kernel, "rms_norm", counting)
    model = base if dtype == torch.float32 else copy.deepcopy(base).to(dtype)
    prompts = [tok.encode(p) for p in ("Hello there", "The capital of France is a city that", "x",
                                       "One two three four five six seven eight nine ten eleven twelve")]
    news = [7, 5, 9, 6]
    stock = generate_tokens(model, prompts, news)
    assert fuse_rms_norms(model) == len(_norms(model))
    try:
        calls.update(kernel=0, refused=0)
        got = engine_tokens(model, tok, prompts, news)
        assert calls["kernel"] > 0 and calls["refused"] == 0, calls  # the engine's steps ran the kernel
        fused = generate_tokens(model, prompts, news)
        with torch.inference_mode():  # and the logits themselves, not only the argmax
            ids = torch.tensor([prompts[3]])
            fused_logits = model(ids).logits
            unfuse_rms_norms(model)
            assert torch.equal(fused_logits, model(ids).logits)
    finally:
        unfuse_rms_norms(model)
    for i, n in enumerate(news):
        assert got[i][:n] == fused[i] == stock[i], f"request {i}"


# ---------------------------------------------------------------------------------------------
# 3. the loader's switch



def _engine(tiny_dir: Path, value: str | None) -> HFEngine:
    from djl_handlers.config.models import ServingConfig

    options = {"model_id": str(tiny_dir), "rolling_batch": "auto", "cpu_linear": "torch", "cpu_attention": "sdpa",
               **({"cpu_norm": value} if value else {})}
    return HFEngine.from_config(ServingConfig.from_properties(options, engine="huggingface"))


@needs_kernel
@pytest.mark.parametrize(("value", "fused"), [(None, True), ("fused", True), ("torch", False)])
def test_the_hf_engine_fuses_norms_by_default_on_the_cpu(tiny_dir: Path, value: str | None, fused: bool) -> None:
    norms = _norms(_engine(tiny_dir, value).model)
    assert norms and all(isinstance(m.__dict__.get("forward"), FusedRMSNorm) == fused for m in norms)


@pytest.fixture
def unbuildable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No compiler on the PATH, an empty kernel folder, and no library remembered by this process."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("DJL_HANDLERS_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_errors", {})
    monkeypatch.setattr(kernel, "_fn", None)
    monkeypatch.setattr(kernel, "_lanes_known", False)
    monkeypatch.setattr(kernel, "_lanes", None)


def test_an_unbuildable_kernel_keeps_torch_norms(tiny_dir: Path, unbuildable: None,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        engine = _engine(tiny_dir, "fused")
    assert not any(isinstance(m.__dict__.get("forward"), FusedRMSNorm) for m in _norms(engine.model))
    assert any("RMSNorm kernel cannot be built" in r.getMessage() and "no C compiler" in r.getMessage()
               for r in caplog.records), caplog.text
    x, weight = _inputs(2, 64, torch.float32)
    assert kernel.rms_norm(x, weight, 1e-6) is None and kernel.lanes() is None
