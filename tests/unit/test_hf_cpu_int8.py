"""``option.quantize=dynamic_int8``: int8 linear layers on the CPU (engines/hf/cpu/int8.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import engine_tokens, generate_tokens  # noqa: E402

from djl_handlers.engines.hf.cpu import int8  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import ConfigError  # noqa: E402

pytest_plugins = ["conftest_models"]
pytestmark = pytest.mark.skipif(int8.unavailable_reason() is not None, reason=str(int8.unavailable_reason()))


@pytest.fixture(params=["kernel", "fbgemm"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each GEMM the layers can run: the package's kernel, and torch's fbgemm (where the kernel
    cannot be built) with the weight range this CPU's fbgemm computes exactly."""
    if request.param == "kernel" and not int8.int8_gemm.available():
        pytest.skip(f"the int8 kernel is unavailable: {int8.int8_gemm.unavailable_reason()}")
    if request.param == "fbgemm":
        if not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines):
            pytest.skip("this torch has no fbgemm")
        monkeypatch.setattr(int8.int8_gemm, "pack", lambda q, scales: None)
        monkeypatch.setattr(int8.int8_gemm, "available", lambda: False)
        monkeypatch.setattr(int8.int8_gemm, "path", lambda: None)
    int8.weight_limit.cache_clear()
    yield request.param
    int8.weight_limit.cache_clear()


def _linear(bias: bool, out: int = 96, inp: int = 80) -> Any:
    torch.manual_seed(0)
    return torch.nn.Linear(inp, out, bias=bias)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 80), (5, 80), (2, 3, 80), (37, 80)])
def test_int8_linear_is_close_to_the_fp32_layer_and_keeps_no_fp32_weight(bias: bool, shape: tuple[int, ...],
                                                                          backend: str) -> None:
    layer = _linear(bias)
    q = int8.Int8Linear(layer)
    assert (q.kernel is not None) == (backend == "kernel") and (q.packed is not None) == (backend == "fbgemm")
    assert ("kernel" in int8.backend()) == (backend == "kernel")
    x = torch.randn(*shape)
    want, got = layer(x), q(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert float((got - want).norm() / want.norm()) < 0.03
    assert not hasattr(q, "weight") and q.scales.shape == (96,)
    assert q(x.bfloat16()).dtype == torch.bfloat16


def test_quantized_weights_are_per_channel_symmetric() -> None:
    weight = torch.randn(6, 10) * torch.arange(1, 7)[:, None]
    q, scales = int8.quantize_weight(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert bool((q.abs().amax(dim=1) == 127).all())
    assert torch.allclose(q.float() * scales[:, None], weight, atol=float(scales.max()) / 2 + 1e-6)


@pytest.mark.parametrize("limit", [int8.FULL_RANGE, int8.SAFE_RANGE])
def test_a_weight_limit_bounds_every_value(limit: int) -> None:
    q, scales = int8.quantize_weight(torch.randn(6, 10), limit)
    assert bool((q.abs().amax(dim=1) == limit).all())


def test_products_at_the_ends_of_both_ranges_sum_exactly_on_this_cpu(backend: str) -> None:
    """Every weight at its channel's peak and every activation at +1 or -1: the pairs a 16-bit
    kernel (AVX2 without VNNI) would saturate. The layer must still give the fp32 answer."""
    layer = torch.nn.Linear(256, 4, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0], [-1.0], [0.5], [-2.0]]).expand(4, 256))
    q = int8.Int8Linear(layer)
    x = torch.stack([torch.ones(256), -torch.ones(256), torch.ones(256).index_fill(0, torch.arange(0, 256, 2), -1.0)])
    assert torch.allclose(q(x), layer(x), rtol=0.02, atol=0.5), (q(x), layer(x))
    kernel = int8.int8_gemm.available()  # the package's kernel never saturates; fbgemm may, then takes [-64, 64]
    assert int8.weight_limit() == (int8.FULL_RANGE if kernel or not int8.saturates() else int8.SAFE_RANGE)


@pytest.mark.parametrize("bias", [False, True])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(bias: bool, backend: str) -> None:
    q = int8.Int8Linear(_linear(bias, out=200, inp=160))
    x = torch.randn(33, 160)
    x[4] *= 50  # a row with a far larger range must not change its neighbours
    whole = q(x)
    for i in range(33):
        assert torch.equal(q(x[i:i + 1]), whole[i:i + 1])
    assert torch.equal(q(x[3:20]), whole[3:20])


def test_quantize_linears_replaces_plain_layers_and_refuses_a_model_without_any() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(8, 4)))
    assert int8.quantize_linears(model) == 2
    assert isinstance(model[0], int8.Int8Linear) and isinstance(model[2][0], int8.Int8Linear)
    assert model(torch.randn(3, 8)).shape == (3, 4)
    with pytest.raises(ConfigError, match="no plain nn.Linear") as err:
        int8.quantize_linears(torch.nn.Sequential(torch.nn.ReLU()))
    assert err.value.field == "option.quantize"


def test_shared_sibling_gemm_gives_the_separate_layers_bits(tiny_model: Any, backend: str) -> None:
    import copy

    model, _ = tiny_model
    shared, alone = copy.deepcopy(model), copy.deepcopy(model)
    assert int8.quantize_linears(shared) == int8.quantize_linears(alone, share=False)
    assert int8.shared_groups(shared) == 4 and int8.shared_groups(alone) == 0
    ids = torch.randint(0, 1000, (3, 9))
    with torch.inference_mode():
        assert torch.equal(shared(ids).logits, alone(ids).logits)
    siblings = [m for m in shared.modules() if isinstance(m, int8.Int8Sibling)]
    assert all(m.__dict__["last"][0] is None for m in siblings)  # no activations kept after a forward
    q = shared.model.layers[0].self_attn.q_proj
    x = torch.randn(2, 64)
    assert torch.equal(q(x), q(x))  # a sibling called twice with one input computes again


def test_engine_on_int8_layers_equals_generate_alone(tiny_dir: Any, backend: str) -> None:
    from djl_handlers.config.models import ServingConfig

    options = {"model_id": str(tiny_dir), "rolling_batch": "auto", "quantize": "dynamic_int8"}
    engine = HFEngine.from_config(ServingConfig.from_properties(options, engine="huggingface"))
    model, tok = engine.model, engine.tokenizer
    assert not [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert engine.cpu_patches["cpu_linear"].startswith("applied: ") and "int8" in engine.cpu_patches["cpu_linear"]
    assert engine.cpu_patches["cpu_fuse_projections"].startswith("applied: 4 q/k/v and gate/up groups")
    assert engine.cpu_patches["silu_mul"] == "applied: 2 SiLU MLPs as down_proj(silu_mul(gate_up(x)))"
    assert int8.backend() in engine.cpu_patches["cpu_linear"]
    prompts = [tok.encode(p) for p in ("Hello there", "The capital of France is a city that", "x",
                                       "One two three four five six seven eight nine ten eleven twelve")]
    news = [7, 5, 9, 6]
    got = engine_tokens(model, tok, prompts, news)
    assert [got[i][:n] for i, n in enumerate(news)] == generate_tokens(model, prompts, news)


def test_dynamic_int8_is_an_hf_quantize_value_and_others_are_refused() -> None:
    from djl_handlers.config.models import ServingConfig

    config = ServingConfig.from_properties({"model_id": "x", "quantize": "dynamic_int8"}, engine="huggingface")
    assert config.hf.quantize == "dynamic_int8"
    with pytest.raises(ConfigError) as err:
        ServingConfig.from_properties({"model_id": "x", "quantize": "int3"}, engine="huggingface")
    assert "quantize" in str(err.value.field)


def test_check_shows_the_int8_path_for_a_cpu_model() -> None:
    from djl_handlers.cli import _cpu

    config = {"engine": "huggingface", "device": "cpu", "hf": {"quantize": "dynamic_int8"}}
    line = _cpu(config)["cpu"]["int8"]
    assert line.startswith("dynamic_int8: int8 linear layers (per-channel") and line.endswith(f" on {int8.backend()}")
    assert "int8" not in _cpu({**config, "hf": {"quantize": None}})["cpu"]


def test_int8_on_a_gpu_is_a_load_error_naming_the_option(tiny_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf import loader

    monkeypatch.setattr(loader, "resolve_device", lambda device: "cuda:0")  # as on a machine with a GPU
    props = {"model_id": str(tiny_dir), "dtype": "fp32", "rolling_batch": "scheduler", "quantize": "dynamic_int8"}
    with pytest.raises(ConfigError, match="runs on the CPU only") as err:
        loader.load_model(loader.LoadOptions.from_config(ServingConfig.from_properties(props, engine="huggingface")))
    assert err.value.field == "option.quantize"
