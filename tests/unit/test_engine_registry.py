"""Engine registry (lazy import, install hints) and the DeepSpeed adapter's wiring (fake deepspeed)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from djl_handlers.config.models import DeepSpeedOptions, ServingConfig
from djl_handlers.engines import registry
from djl_handlers.engines.base import EngineRequest
from djl_handlers.errors import ConfigError, EngineNotInstalled

pytest_plugins = ["conftest_models"]  # fixture: tiny_dir

FAKES = Path(__file__).resolve().parents[1] / "fakes"


def _drop(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def fakes_on_path(monkeypatch: pytest.MonkeyPatch) -> Any:
    _drop("vllm")
    _drop("tensorrt_llm")
    monkeypatch.syspath_prepend(str(FAKES))
    yield
    _drop("vllm")
    _drop("tensorrt_llm")


@pytest.fixture
def no_engine_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make vllm/tensorrt_llm/deepspeed look uninstalled even where they are."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: Any = None) -> Any:
        if name.split(".")[0] in ("vllm", "tensorrt_llm", "deepspeed"):
            return None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_every_engine_is_registered() -> None:
    assert set(registry.ENGINES) >= {"huggingface", "deepspeed", "vllm", "lmi-dist", "tensorrt_llm"}
    assert registry.ENGINES["lmi-dist"].startswith("djl_handlers.engines.external.vllm:")


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("huggingface", "torch"),
        ("deepspeed", "deepspeed"),
        ("vllm", "vllm"),
        ("lmi-dist", "vllm"),
        ("tensorrt_llm", "tensorrt_llm"),
        ("trtllm", "tensorrt_llm"),
        ("fake", None),
    ],
)
def test_required_module(name: str, module: Any) -> None:
    assert registry.required_module(name) == module


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("vllm", "engine 'vllm' needs the vllm package: pip install djl_handlers[vllm]"),
        ("lmi-dist", "engine 'lmi-dist' needs the vllm package: pip install djl_handlers[vllm]"),
        ("tensorrt_llm", "engine 'tensorrt_llm' needs the tensorrt_llm package: pip install djl_handlers[trtllm]"),
        ("trtllm", "engine 'trtllm' needs the tensorrt_llm package: pip install djl_handlers[trtllm]"),
        ("deepspeed", "engine 'deepspeed' needs the deepspeed package: pip install djl_handlers[deepspeed]"),
    ],
)
def test_missing_library_names_the_extra(no_engine_libraries: None, name: str, message: str) -> None:
    with pytest.raises(EngineNotInstalled) as info:
        registry.load_engine_class(name)
    assert str(info.value) == message
    assert info.value.status == 500 and info.value.field == "engine"
    no_chain = info.value.__context__ is None or info.value.__suppress_context__
    assert info.value.__cause__ is None and no_chain  # no traceback noise


def test_adapter_import_time_import_error_becomes_engine_not_installed(no_engine_libraries: None) -> None:
    from djl_handlers.engines.external.vllm import VllmEngine

    config = ServingConfig.from_properties({"model_id": "x", "rolling_batch": "auto"}, engine="vllm")
    with pytest.raises(EngineNotInstalled, match=r"pip install djl_handlers\[vllm\]"):
        VllmEngine.from_config(config)


def test_unknown_engine_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="engine 'nope' is unknown"):
        registry.load_engine_class("nope")


def test_bug_in_our_module_is_not_disguised(fakes_on_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.ENGINES, "vllm", "djl_handlers.engines.no_such_module:X")  # type: ignore[index]
    with pytest.raises(ModuleNotFoundError) as info:
        registry.load_engine_class("vllm")
    assert not isinstance(info.value, EngineNotInstalled)


def test_translate_import_error() -> None:
    assert isinstance(
        registry.translate_import_error("vllm", ImportError("x", name="vllm.outputs")), EngineNotInstalled
    )
    assert registry.translate_import_error("vllm", ImportError("x", name="torch")) is None
    assert registry.translate_import_error("huggingface", ImportError("x", name="torch")) is not None


def test_classes_load_lazily_with_from_config(fakes_on_path: None) -> None:
    from djl_handlers.engines.external.trtllm import TrtLlmEngine
    from djl_handlers.engines.external.vllm import LmiDistEngine, VllmEngine

    assert registry.load_engine_class("vllm") is VllmEngine
    assert registry.load_engine_class("lmi-dist") is LmiDistEngine
    assert issubclass(LmiDistEngine, VllmEngine)
    assert registry.load_engine_class("trtllm") is TrtLlmEngine
    for cls in (VllmEngine, LmiDistEngine, TrtLlmEngine, registry.load_engine_class("huggingface")):
        assert callable(cls.from_config)


def test_registry_import_pulls_no_engine_library() -> None:
    import subprocess

    code = (
        "import sys, djl_handlers.engines.registry, djl_handlers.engines.external.vllm, "
        "djl_handlers.engines.external.trtllm; "
        "print(sorted(m for m in ('torch', 'vllm', 'tensorrt_llm', 'deepspeed') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- DeepSpeed wiring (a fake ``deepspeed`` mirroring init_inference / init_distributed / comm) ----


def fake_deepspeed(world_size: int = 1, initialized: bool = False) -> types.ModuleType:
    ds = types.ModuleType("deepspeed")
    ds.__spec__ = importlib.machinery.ModuleSpec("deepspeed", None)
    ds.calls = []  # type: ignore[attr-defined]
    cdb = SimpleNamespace(shm_vector_kernel_level=2)
    state = {"initialized": initialized}

    def init_inference(model: Any, config: Any = None, **kwargs: Any) -> Any:
        ds.calls.append(("init_inference", kwargs))  # type: ignore[attr-defined]
        return SimpleNamespace(module=model)

    def init_distributed(dist_backend: str = "nccl", auto_mpi_discovery: bool = True, **kwargs: Any) -> None:
        ds.calls.append(("init_distributed", dist_backend))  # type: ignore[attr-defined]
        state["initialized"] = True

    ds.init_inference = init_inference  # type: ignore[attr-defined]
    ds.init_distributed = init_distributed  # type: ignore[attr-defined]
    ds.comm = SimpleNamespace(  # type: ignore[attr-defined]
        is_initialized=lambda: state["initialized"],
        get_world_size=lambda: world_size,
        comm=SimpleNamespace(cdb=cdb),
    )
    return ds


def ds_config(tp: int = 1, dtype: str = "fp32", **options: Any) -> Any:
    return SimpleNamespace(tensor_parallel_degree=tp, dtype=dtype, deepspeed=DeepSpeedOptions(**options))


def test_init_inference_wiring_single_process() -> None:
    torch = pytest.importorskip("torch")
    from djl_handlers.engines.external.deepspeed import init_deepspeed

    ds, model = fake_deepspeed(), torch.nn.Linear(2, 2)
    assert init_deepspeed(model, ds_config(dtype="bf16", max_tokens=512), ds) is model
    assert [c[0] for c in ds.calls] == ["init_inference"]
    kwargs = ds.calls[0][1]
    assert kwargs["dtype"] is torch.bfloat16
    assert kwargs["replace_with_kernel_inject"] is False
    assert kwargs["tensor_parallel"] == {"tp_size": 1}
    assert kwargs["max_tokens"] == 512


def test_tensor_parallel_initialises_distributed_and_disables_shm_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from djl_handlers.engines.external.deepspeed import init_deepspeed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ds = fake_deepspeed(world_size=2)
    init_deepspeed(torch.nn.Linear(2, 2), ds_config(tp=2), ds)
    assert ds.calls[0] == ("init_distributed", "gloo")
    assert ds.calls[1][1]["tensor_parallel"] == {"tp_size": 2}
    assert ds.comm.comm.cdb.shm_vector_kernel_level == 0


def test_tensor_parallel_needs_matching_world_size() -> None:
    torch = pytest.importorskip("torch")
    from djl_handlers.engines.external.deepspeed import init_deepspeed

    with pytest.raises(ConfigError, match="tensor_parallel_degree=2 needs 2 processes"):
        init_deepspeed(torch.nn.Linear(2, 2), ds_config(tp=2), fake_deepspeed(world_size=1, initialized=True))


def test_quantize_is_refused() -> None:
    torch = pytest.importorskip("torch")
    from djl_handlers.engines.external.deepspeed import init_deepspeed

    with pytest.raises(ConfigError, match="quantize"):
        init_deepspeed(torch.nn.Linear(2, 2), ds_config(quantize="dynamic_int8"), fake_deepspeed())


def test_deepspeed_engine_steps_the_wrapped_model(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.params.generation import GenerationParameters

    ds = fake_deepspeed()
    monkeypatch.setitem(sys.modules, "deepspeed", ds)
    cls = registry.load_engine_class("deepspeed")
    config = ServingConfig.from_properties({"model_id": str(tiny_dir)}, engine="deepspeed")
    engine = cls.from_config(config)
    assert engine.name == "deepspeed" and isinstance(engine, HFEngine)
    assert [c[0] for c in ds.calls] == ["init_inference"]
    params = GenerationParameters.from_dict({"max_new_tokens": 4}, engine="deepspeed")
    prompt = engine.tokenizer.encode("Hello")
    engine.add_request(EngineRequest(1, prompt, params, "Hello"))
    tokens = [o.token_id for _ in range(4) for o in engine.step()]
    reference = HFEngine.from_config(ServingConfig.from_properties({"model_id": str(tiny_dir)}))
    reference.add_request(EngineRequest(1, prompt, params, "Hello"))
    assert tokens == [o.token_id for _ in range(4) for o in reference.step()]
    assert len(tokens) == 4
