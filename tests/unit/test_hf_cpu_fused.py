"""``option.cpu_fuse_projections``: sibling projections as one oneDNN GEMM (engines/hf/cpu/fused.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import engine_tokens, generate_tokens  # noqa: E402

from djl_handlers.engines.hf.cpu import fused  # noqa: E402
from djl_handlers.engines.hf.cpu import linear as packed_linear  # noqa: E402
from djl_handlers.engines.hf.cpu.fused import FusedMember, ProjectionGroup, fuse_projections, unfuse_projections  # noqa: E402
from djl_handlers.engines.hf.cpu.linear import PackedLinear, prepack_linears, unpack_linears  # noqa: E402
from djl_handlers.engines.hf.cpu.patches import revert  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402

pytest_plugins = ["conftest_models"]
pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch has no oneDNN")


def _siblings(dtype: Any, sizes: tuple[int, ...] = (96, 32, 32), inp: int = 80, bias: bool = False) -> list[Any]:
    torch.manual_seed(0)
    return [torch.nn.Linear(inp, n, bias=bias).to(dtype) for n in sizes]


def _group(layers: list[Any]) -> list[FusedMember]:
    group = ProjectionGroup(layers)
    return [FusedMember(group, slot, None) for slot in range(len(layers))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 80), (5, 80), (2, 3, 80), (1, 1, 80), (37, 80)])
def test_each_member_computes_its_own_linear_layer(dtype: Any, bias: bool, shape: tuple[int, ...]) -> None:
    layers = _siblings(dtype, bias=bias)
    members = _group(layers)
    x = torch.randn(*shape).to(dtype)
    for layer, member in zip(layers, members, strict=True):
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        got = member(x)
        assert got.shape == expected.shape and got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol)


def test_a_row_gets_the_same_bits_alone_and_in_any_batch_and_in_any_call_order() -> None:
    layers = _siblings(torch.float32, sizes=(576, 192, 192), inp=576)
    members = _group(layers)
    x = torch.randn(40, 576)
    whole = [m(x) for m in members]
    for rows in (1, 2, 3, 16, 33):
        part = x[:rows].clone()
        for order in ((0, 1, 2), (2, 0, 1), (1, 1, 0)):
            for slot in order:
                assert torch.equal(members[slot](part), whole[slot][:rows]), (rows, order, slot)


def test_a_sibling_called_with_the_same_tensor_reuses_the_fused_result() -> None:
    layers = _siblings(torch.float32)
    members = _group(layers)
    group = members[0].group
    calls: list[int] = []
    real = packed_linear.run_packed

    def counting(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    x = torch.randn(4, 80)
    fused.run_packed = counting  # type: ignore[assignment]
    try:
        q, k, v = members[0](x), members[1](x), members[2](x)
        assert len(calls) == 1 and group._x is None  # all taken: the kept result is released
        members[0](x)
        members[0](x)  # the same member again: a new GEMM, not a stale slice
        assert len(calls) == 3
        y = torch.randn(4, 80)
        ky = members[1](y)  # another input: its own GEMM
        vy = members[2](y)  # its sibling takes the kept slice of y's GEMM
        assert len(calls) == 4
    finally:
        fused.run_packed = real  # type: ignore[assignment]
    assert torch.allclose(ky, torch.nn.functional.linear(y, layers[1].weight), atol=1e-5)
    assert torch.allclose(vy, torch.nn.functional.linear(y, layers[2].weight), atol=1e-5)
    assert torch.allclose(v, torch.nn.functional.linear(x, layers[2].weight), atol=1e-5)
    assert torch.allclose(q, torch.nn.functional.linear(x, layers[0].weight), atol=1e-5)
    assert torch.allclose(k, torch.nn.functional.linear(x, layers[1].weight), atol=1e-5)


def test_in_place_changes_of_input_or_weight_are_seen() -> None:
    layers = _siblings(torch.float32)
    members = _group(layers)
    x = torch.randn(3, 80)
    members[0](x)
    x.mul_(3)  # in place between the siblings: the kept result is stale
    assert torch.allclose(members[1](x), torch.nn.functional.linear(x, layers[1].weight), atol=1e-5)
    with torch.no_grad():
        layers[2].weight.add_(1)
    assert torch.allclose(members[2](x), torch.nn.functional.linear(x, layers[2].weight), atol=1e-4)


def test_other_dtypes_go_to_torch() -> None:
    members = _group(_siblings(torch.float32))
    with pytest.raises(RuntimeError, match="same dtype"):
        members[0](torch.randn(2, 80, dtype=torch.float64))


class _Attention(torch.nn.Module):
    def __init__(self, flatten: bool = False) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(16, n, bias=False) for n in (16, 8, 8))
        self.flatten = flatten

    def forward(self, x: Any) -> Any:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.flatten:  # code that cannot take a strided slice
            q = q.view(-1)
            return q.sum() + k.sum() + v.sum()
        return q.view(*x.shape[:-1], 4, 4).sum(-1).sum(-1) + k.sum(-1) + v.sum(-1)


class _Tiny(torch.nn.Module):
    """A model-shaped module: ``config.vocab_size``, ``model(input_ids=...)`` returning ``.logits``."""

    def __init__(self, flatten: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.config = type("C", (), {"vocab_size": 20})()
        self.embed = torch.nn.Embedding(20, 16)
        self.attn = _Attention(flatten)
        self.mlp = torch.nn.Module()
        self.mlp.gate_proj, self.mlp.up_proj = torch.nn.Linear(16, 24), torch.nn.Linear(16, 24)

    def forward(self, input_ids: Any, use_cache: bool = False) -> Any:
        h = self.embed(input_ids)
        out = self.attn(h).unsqueeze(-1) + (self.mlp.gate_proj(h) * self.mlp.up_proj(h))
        return type("O", (), {"logits": out})()


def test_groups_are_found_by_name_and_fused_forward_matches() -> None:
    model = _Tiny()
    ids = torch.tensor([[1, 2, 3]])
    want = model(ids).logits
    assert fuse_projections(model) == 2
    assert isinstance(model.attn.k_proj.__dict__["forward"], FusedMember)
    assert torch.allclose(model(ids).logits, want, atol=1e-5)
    assert unfuse_projections(model) == 5 and "forward" not in model.attn.q_proj.__dict__


def test_a_model_that_cannot_take_the_slices_keeps_its_projections_apart(caplog: Any) -> None:
    model = _Tiny(flatten=True)
    with caplog.at_level("DEBUG"):  # patches.apply reports it at INFO, once
        assert fuse_projections(model) == 0
    assert "does not take the fused projections" in caplog.text
    assert "forward" not in model.attn.q_proj.__dict__
    model(torch.tensor([[1, 2]]))  # still runs


def test_mismatched_siblings_and_pre_hooks_are_not_grouped() -> None:
    model = _Tiny()
    model.attn.v_proj = torch.nn.Linear(12, 8, bias=False)  # another input size
    model.mlp.up_proj.register_forward_pre_hook(lambda module, args: None)
    assert fuse_projections(model, check=False) == 0


def test_fusing_drops_the_members_own_packed_copy_and_unpacking_restores_everything() -> None:
    model = _Tiny()
    assert prepack_linears(model) == 5
    assert fuse_projections(model, check=False) == 2
    member = model.attn.q_proj.__dict__["forward"]
    assert isinstance(member.previous, PackedLinear) and member.previous.packed is None
    unfuse_projections(model)
    restored = model.attn.q_proj.__dict__["forward"]
    assert isinstance(restored, PackedLinear) and restored.packed is not None
    x = torch.randn(2, 16)
    assert torch.allclose(model.attn.q_proj(x), torch.nn.functional.linear(x, model.attn.q_proj.weight), atol=1e-5)
    fuse_projections(model, check=False)
    assert unfuse_projections(model) == 5 and unpack_linears(model) == 5
    assert all("forward" not in m.__dict__ for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("fixture", ["tiny_model", pytest.param("real_model", marks=pytest.mark.slow)])
def test_engine_with_fused_projections_equals_generate_alone(fixture: str, request: pytest.FixtureRequest) -> None:
    model, tok = request.getfixturevalue(fixture)
    prompts = [tok.encode(p) for p in ("Hello there", "The capital of France is a city that", "x",
                                       "One two three four five six seven eight nine ten eleven twelve")]
    news = [7, 5, 9, 6]
    prepack_linears(model)
    assert fuse_projections(model) > 0
    try:
        got = engine_tokens(model, tok, prompts, news)
        assert [got[i][:n] for i, n in enumerate(news)] == generate_tokens(model, prompts, news)
    finally:
        revert(model)



@pytest.mark.parametrize(("options", "fused"), [({}, True), ({"cpu_fuse_projections": "false"}, False),
                                                ({"cpu_linear": "torch"}, False)])
def test_the_hf_engine_fuses_by_default_on_the_cpu(tiny_dir: Any, options: dict[str, str], fused: bool) -> None:
    from djl_handlers.config.models import ServingConfig

    config = ServingConfig.from_properties({"model_id": str(tiny_dir), "rolling_batch": "auto", **options},
                                           engine="huggingface")
    engine = HFEngine.from_config(config)
    names = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    members = [m for name, m in engine.model.named_modules() if name.rsplit(".", 1)[-1] in names]
    assert members and all(isinstance(m.__dict__.get("forward"), FusedMember) == fused for m in members)


# -- SiLU·mul over the fused gate/up output (kernels/silu_mul.py, FusedMLP) ---------------------

from djl_handlers.engines.hf.cpu.fused import FusedMLP  # noqa: E402
from djl_handlers.kernels import silu_mul as silu_kernel  # noqa: E402

needs_silu = pytest.mark.skipif(not silu_kernel.available(),
                                reason=f"kernel not built: {silu_kernel.unavailable_reason()}")


@needs_silu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 8), (3, 1, 3072), (1, 700, 3072), (5, 2, 200), (40, 3072)])
def test_silu_mul_computes_silu_gate_times_up(dtype: Any, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=gen) * 4).to(dtype)
    got, want = silu_kernel.silu_mul(x), silu_kernel.reference(x)
    assert got is not None and got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
    if dtype == torch.float32:
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    else:  # torch's rounding steps: only an expf last-bit difference can flip a bf16 rounding
        assert float((got != want).float().mean()) < 0.01
        assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)


@needs_silu
def test_silu_mul_rows_are_independent_and_strided_input_is_read_in_place() -> None:
    x = torch.randn(50, 1, 1000)
    whole = silu_kernel.silu_mul(x)
    for rows in (1, 2, 7, 33):
        assert torch.equal(silu_kernel.silu_mul(x[:rows]), whole[:rows])  # type: ignore[index]
    wide = torch.randn(6, 1300)
    assert torch.equal(silu_kernel.silu_mul(wide[:, 100:1100]), silu_kernel.silu_mul(wide[:, 100:1100].contiguous()))


@needs_silu
def test_silu_mul_refuses_what_it_does_not_handle_and_keeps_nan() -> None:
    assert silu_kernel.silu_mul(torch.randn(2, 7)) is None  # odd width
    assert silu_kernel.silu_mul(torch.randn(2, 8).half()) is None
    assert silu_kernel.silu_mul(torch.randn(2, 8).double()) is None
    x = torch.randn(2, 8)
    x[0, 1] = float("nan")
    out = silu_kernel.silu_mul(x)
    assert out is not None and torch.isnan(out[0, 1]) and not torch.isnan(out[1]).any()
    big = torch.tensor([[-200.0, 200.0, 1.0, 1.0]])  # exp overflow on both sides
    assert torch.allclose(silu_kernel.silu_mul(big), silu_kernel.reference(big))  # type: ignore[arg-type]


def _llama_mlp(dtype: Any) -> Any:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=160, hidden_act="silu")
    holder = torch.nn.Module()
    holder.mlp = LlamaMLP(config).to(dtype).eval()
    holder.config = type("C", (), {"vocab_size": 0})()  # no probe forward: fused with check=False
    return holder


@needs_silu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_llama_mlp_gets_the_fused_forward_and_matches_its_own(dtype: Any) -> None:
    holder = _llama_mlp(dtype)
    mlp = holder.mlp
    x = torch.randn(3, 1, 64).to(dtype)
    with torch.inference_mode():
        want = mlp(x)
        assert fuse_projections(holder, check=False) == 1
        assert isinstance(mlp.__dict__.get("forward"), FusedMLP)
        got = mlp(x)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
    assert unfuse_projections(holder) == 2 and "forward" not in mlp.__dict__


@needs_silu
def test_forward_hooks_on_gate_or_up_take_the_modules_own_path() -> None:
    holder = _llama_mlp(torch.float32)
    mlp = holder.mlp
    fuse_projections(holder, check=False)
    seen: list[str] = []
    handle = mlp.up_proj.register_forward_hook(lambda module, args, out: seen.append("up") or out * 0)
    x = torch.randn(2, 64)
    with torch.inference_mode():
        out = mlp(x)
    assert seen == ["up"] and torch.count_nonzero(out) == 0  # the hook ran and its output was used
    handle.remove()
    with torch.inference_mode():
        assert torch.count_nonzero(mlp(x)) > 0 and seen == ["up"]  # fused again: gate/up hooks are not called


@needs_silu
def test_the_tiny_model_gets_fused_mlps(tiny_model: Any) -> None:
    model, _ = tiny_model
    prepack_linears(model)
    try:
        assert fuse_projections(model) == 4  # 2 layers x (q/k/v, gate/up)
        assert sum(isinstance(m.__dict__.get("forward"), FusedMLP) for m in model.modules()) == 2
    finally:
        revert(model)
    assert not any(isinstance(m.__dict__.get("forward"), (FusedMLP, FusedMember)) for m in model.modules())


@needs_silu
def test_gate_or_up_replaced_after_fusing_takes_the_modules_own_path() -> None:
    """A wrapper put around gate_proj later (PEFT, a sharded layer) must see its call."""
    holder = _llama_mlp(torch.float32)
    mlp = holder.mlp
    fuse_projections(holder, check=False)
    calls: list[int] = []

    class Wrapper(torch.nn.Module):
        def __init__(self, base: Any) -> None:
            super().__init__()
            self.base_layer = base

        def forward(self, x: Any) -> Any:
            calls.append(1)
            return self.base_layer(x) * 0

    mlp.gate_proj = Wrapper(mlp.gate_proj)
    with torch.inference_mode():
        out = mlp(torch.randn(2, 64))
    assert calls == [1] and torch.count_nonzero(out) == 0

