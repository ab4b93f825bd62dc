"""LoRA adapters on the HF engine with real models: per-row adapters in one rolling batch.

Adapters are made with peft for the tiny random Llama (and, marked slow, the embedded SmolLM2):
random but fixed weights, saved to a tmp folder. The reference for every row is ``generate()`` of
that prompt alone on the base model with the row's adapter merged (peft ``merge_and_unload``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest_models import embedded_dir, real_model, tiny_dir, tiny_model  # noqa: F401
from lora_adapters import ATTENTION, MLP, make_adapter, merged_generate

from djl_handlers.io import Input
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

PROMPTS = ["Deep learning is", "The capital of France is", "Once upon a time", "Hello, my name is",
           "In 1990 the", "Water boils at"]
ROWS: list[Optional[str]] = [None, "a", "b", "c", "a", None]
N = 10


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, tiny_model: Any) -> dict[str, Path]:  # noqa: F811
    model, _ = tiny_model
    root = tmp_path_factory.mktemp("tiny-adapters")
    return {
        "a": make_adapter(model, root / "a", seed=1, rank=4, targets=ATTENTION),
        "b": make_adapter(model, root / "b", seed=2, rank=8, targets=("q_proj", "v_proj", "down_proj")),
        "c": make_adapter(model, root / "c", seed=3, rank=2, targets=MLP),
    }


@pytest.fixture(scope="module")
def expected(tiny_model: Any, adapters: dict[str, Path]) -> dict[tuple[str, Optional[str]], str]:  # noqa: F811
    model, tok = tiny_model
    out = {}
    for prompt, name in zip(PROMPTS, ROWS, strict=True):
        for which in {name, None}:
            ids = merged_generate(model, tok, prompt, N, adapters[which] if which else None)
            out[(prompt, which)] = tok.decode(ids, skip_special_tokens=True)
    return out


def _call(service: InferenceService, kind: str, name: str, src: Optional[Path] = None, **options: str) -> Any:
    props = {"handler": f"{kind}_adapter", "name": name, **({"src": str(src)} if src else {})}
    return service.adapter_call(kind, Input.from_parts(props, [(k, v.encode()) for k, v in options.items()]))


def _service(model_dir: Path, **options: str) -> InferenceService:
    service = InferenceService("huggingface")
    init = {"model_id": str(model_dir), "dtype": "fp32", "enable_lora": "true", "max_loras": "4",
            "rolling_batch": "auto", **options}
    assert service.handle(Input.from_parts(init, ())) is None
    return service


def _body(prompt: str, adapter: Optional[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": prompt, "parameters": {"max_new_tokens": N}}
    if adapter:
        body["adapters"] = adapter
    return body


def test_mixed_adapters_in_one_rolling_batch_equal_merged_generate(
        tiny_dir: Path, adapters: dict[str, Path], expected: dict[tuple[str, Optional[str]], str]) -> None:  # noqa: F811
    service = _service(tiny_dir)
    for name, folder in adapters.items():
        out = _call(service, "register", name, folder)
        assert (out.code, out.message) == (200, f"Adapter {name} registered")
    driver = RollingBatchDriver(service.handle)
    requests = [driver.submit(json_request(_body(p, a))) for p, a in zip(PROMPTS[:3], ROWS[:3], strict=True)]
    driver.step()
    driver.step()  # the rest join a running batch that already mixes adapters
    requests += [driver.submit(json_request(_body(p, a))) for p, a in zip(PROMPTS[3:], ROWS[3:], strict=True)]
    driver.run()
    for req, prompt, name in zip(requests, PROMPTS, ROWS, strict=True):
        assert req.code is None, req.error
        got = json.loads(req.text)["generated_text"]
        assert got == expected[(prompt, name)], (prompt, name)
    # the adapters really change the output (else equality above would prove nothing)
    assert sum(expected[(p, a)] != expected[(p, None)] for p, a in zip(PROMPTS, ROWS, strict=True) if a) >= 3


def test_dynamic_batch_list_inputs_with_a_list_of_adapters(
        tiny_dir: Path, adapters: dict[str, Path], expected: dict[tuple[str, Optional[str]], str]) -> None:  # noqa: F811
    service = _service(tiny_dir, rolling_batch="disable")
    for name in ("a", "b"):
        assert _call(service, "register", name, adapters[name]).code == 200
    body = {"inputs": PROMPTS[:3], "adapters": ROWS[:3], "parameters": {"max_new_tokens": N}}
    item = {"Content-Type": "application/json"}
    props = {f"batch_{i:03d}.{k}": v for i in range(2) for k, v in item.items()}
    batch = Input.from_parts({"batch_size": "2", **props},
                             [("batch_000.data", json.dumps(body).encode()),
                              ("batch_001.data", json.dumps({"inputs": "x", "adapters": "zzz"}).encode())])
    out = service.handle(batch)
    first = json.loads(bytes(out.content.value_at(0)))
    want = [expected[(p, a)] for p, a in zip(PROMPTS[:3], ROWS[:3], strict=True)]
    assert [r["generated_text"] for r in first] == want
    second = json.loads(bytes(out.content.value_at(1)))
    assert second["code"] == 404 and "'zzz'" in second["error"]  # the neighbour is unaffected


def test_unregister_while_running_lets_the_request_finish(
        tiny_dir: Path, adapters: dict[str, Path], expected: dict[tuple[str, Optional[str]], str]) -> None:  # noqa: F811
    service = _service(tiny_dir)
    assert _call(service, "register", "a", adapters["a"]).code == 200
    driver = RollingBatchDriver(service.handle)
    running = driver.submit(json_request(_body(PROMPTS[1], "a")))
    driver.step()
    driver.step()
    out = _call(service, "unregister", "a")
    assert (out.code, out.message) == (200, "Adapter a unregistered")
    late = driver.submit(json_request(_body(PROMPTS[1], "a")))
    driver.run()
    assert json.loads(running.text)["generated_text"] == expected[(PROMPTS[1], "a")]
    assert late.code == 404 and "'a' is not registered" in (late.error or "")
    assert service.lora is not None and not service.lora.registry.retiring  # unloaded once it finished
    assert service.engine.lora.loaded == {}


def test_max_loras_queues_rows_until_an_adapter_slot_frees(
        tiny_model: Any, adapters: dict[str, Path], expected: dict[tuple[str, Optional[str]], str]) -> None:  # noqa: F811
    import copy

    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.engines.hf.lora import LoraSet
    from djl_handlers.lora.registry import AdapterSpec
    from djl_handlers.params.generation import GenerationParameters

    model, tok = tiny_model
    engine = HFEngine(copy.deepcopy(model), tok, max_batch_size=8)
    engine.lora = LoraSet(engine.model, max_loras=1, max_lora_rank=16, max_cpu_loras=2)
    for name in ("a", "b"):
        engine.load_adapter(AdapterSpec(name, str(adapters[name])))
    params = GenerationParameters.from_dict({"max_new_tokens": N}, "huggingface")
    rows = [(PROMPTS[0], "a"), (PROMPTS[1], "b"), (PROMPTS[2], None)]
    for rid, (prompt, name) in enumerate(rows):
        engine.add_request(EngineRequest(rid, tok(prompt).input_ids, params, prompt, name))
    tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
    engine.step()
    assert engine.running_ids == (0,)  # b would be a 2nd adapter: it waits, and the base row behind it too (FIFO)
    while any(len(t) < N for t in tokens.values()):
        for out in engine.step():
            tokens[out.request_id].append(out.token_id)
            if len(tokens[out.request_id]) == N:
                engine.release(out.request_id)
        assert len({r for r in engine.running_ids if rows[r][1]}) <= 1
    for rid, (prompt, name) in enumerate(rows):
        want = expected[(prompt, name)] if (prompt, name) in expected else None
        if want is not None:
            assert tok.decode(tokens[rid], skip_special_tokens=True) == want


def test_limits_are_clear_errors(tiny_dir: Path, adapters: dict[str, Path]) -> None:  # noqa: F811
    service = _service(tiny_dir, max_loras="1", max_cpu_loras="2", max_lora_rank="4")
    out = _call(service, "register", "b", adapters["b"])  # rank 8
    assert out.code == 507 and "rank 8 > option.max_lora_rank=4" in out.message
    assert _call(service, "register", "a", adapters["a"]).code == 200
    assert _call(service, "register", "c", adapters["c"]).code == 200
    out = _call(service, "register", "c2", adapters["c"])
    assert out.code == 507 and "max_cpu_loras=2" in out.message and "'c2'" in out.message
    out = _call(service, "register", "bad", adapters["a"].parent)
    assert out.code == 400 and "adapter_config.json" in out.message
    lazy = _call(service, "register", "lazy", adapters["c"], preload="false")
    assert lazy.code == 200  # registered without loading; loading it at first use hits the limit
    driver = RollingBatchDriver(service.handle)
    req = driver.submit(json_request(_body("hi", "lazy")))
    driver.run()
    assert req.code == 507 and "max_cpu_loras" in (req.error or "")


def test_lora_disabled_answers_adapter_calls_with_400(tiny_dir: Path, adapters: dict[str, Path]) -> None:  # noqa: F811
    service = InferenceService("huggingface")
    service.handle(Input.from_parts({"model_id": str(tiny_dir), "dtype": "fp32"}, ()))
    out = _call(service, "register", "a", adapters["a"])
    assert out.code == 400 and "option.enable_lora=true" in out.message


@pytest.mark.slow
def test_embedded_smollm2_mixed_batch(tmp_path: Path, embedded_dir: Path, real_model: Any) -> None:  # noqa: F811
    model, tok = real_model
    folders = {"x": make_adapter(model, tmp_path / "x", seed=7, rank=8, std=0.02),
               "y": make_adapter(model, tmp_path / "y", seed=8, rank=4, targets=MLP, std=0.02)}
    rows: list[Optional[str]] = ["x", None, "y"]
    prompts = PROMPTS[:3]
    want = [tok.decode(merged_generate(model, tok, p, N, folders[a] if a else None), skip_special_tokens=True)
            for p, a in zip(prompts, rows, strict=True)]
    service = _service(embedded_dir)
    for name, folder in folders.items():
        assert _call(service, "register", name, folder).code == 200
    driver = RollingBatchDriver(service.handle)
    requests = [driver.submit(json_request(_body(p, a))) for p, a in zip(prompts, rows, strict=True)]
    driver.run()
    assert [json.loads(r.text)["generated_text"] for r in requests] == want


def test_stacked_and_grouped_strategies_agree_with_peft(tiny_model: Any, adapters: dict[str, Path]) -> None:  # noqa: F811
    """One forward of a mixed batch (adapters with different ranks and target layers, base rows):
    both strategies give peft's mixed-adapter logits (``adapter_names``)."""
    import copy

    import torch
    from peft import PeftModel

    from djl_handlers.engines.hf.lora import LoraSet
    from djl_handlers.lora.registry import AdapterSpec

    model, tok = tiny_model
    ours = copy.deepcopy(model)
    lora = LoraSet(ours, max_loras=4, max_lora_rank=16)
    for name, folder in adapters.items():
        lora.load(AdapterSpec(name, str(folder)))
    reference = PeftModel.from_pretrained(copy.deepcopy(model), str(adapters["a"]), adapter_name="a")
    for name in ("b", "c"):
        reference.load_adapter(str(adapters[name]), adapter_name=name)
    rows = ["a", None, "c", "b", "a", None]
    ids = tok(["Deep learning is"] * len(rows), return_tensors="pt").input_ids
    with torch.inference_mode():
        want = reference.eval()(input_ids=ids, adapter_names=[r or "__base__" for r in rows]).logits
        got = {}
        for strategy in ("stacked", "grouped"):
            lora.strategy = strategy
            lora.use([lora.resolve(r) if r else None for r in rows])
            got[strategy] = ours(input_ids=ids).logits
        lora.use([None] * len(rows))
        base = ours(input_ids=ids).logits
    for strategy, logits in got.items():
        assert torch.allclose(logits, want, atol=1e-4), strategy
    assert not torch.allclose(base[0], want[0], atol=1e-2)  # the adapters matter
    assert torch.allclose(base[1], want[1], atol=1e-5)  # base rows are untouched


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_deepspeed_entry_point_mixed_adapters(
        tiny_dir: Path, adapters: dict[str, Path], expected: dict[tuple[str, Optional[str]], str]) -> None:  # noqa: F811
    """The same hooks on the module DeepSpeed wraps (``init_inference``, tensor_parallel_degree=1)."""
    service = InferenceService("deepspeed")
    init = {"model_id": str(tiny_dir), "dtype": "fp32", "rolling_batch": "deepspeed", "enable_lora": "true"}
    assert service.handle(Input.from_parts(init, ())) is None
    assert getattr(service.engine, "ds_engine", None) is not None  # really wrapped by deepspeed
    for name in ("a", "c"):
        assert _call(service, "register", name, adapters[name]).code == 200
    rows = [(PROMPTS[1], "a"), (PROMPTS[0], None), (PROMPTS[3], "c")]
    driver = RollingBatchDriver(service.handle)
    requests = [driver.submit(json_request(_body(p, a))) for p, a in rows]
    driver.run()
    assert [json.loads(r.text)["generated_text"] for r in requests] == [expected[row] for row in rows]
