"""The vLLM adapter against the fake ``vllm`` package in tests/fakes (mirrors vLLM's V1 API)."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.errors import InvalidParameter, PromptTooLong
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.params.translate import to_vllm

FAKES = Path(__file__).resolve().parents[1] / "fakes"


def _drop(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Any:
    _drop("vllm")
    monkeypatch.syspath_prepend(str(FAKES))
    import vllm

    assert getattr(vllm, "IS_FAKE", False), vllm.__file__
    yield vllm
    _drop("vllm")


def make_engine(options: dict[str, str] | None = None, engine: str = "vllm") -> Any:
    from djl_handlers.engines.external.vllm import LmiDistEngine, VllmEngine

    options = {"model_id": "toy", "rolling_batch": "auto", **(options or {})}
    config = ServingConfig.from_properties(options, engine=engine)
    cls = LmiDistEngine if engine == "lmi-dist" else VllmEngine
    return cls.from_config(config)


def params(**kwargs: Any) -> GenerationParameters:
    return GenerationParameters.from_dict(kwargs, engine="vllm")


def add(engine: Any, rid: int, prompt: str, **kwargs: Any) -> None:
    engine.add_request(EngineRequest(rid, engine.tokenizer.encode(prompt), params(**kwargs), prompt))


def run(engine: Any, max_steps: int = 100) -> dict[int, list[StepOutput]]:
    """Step until nothing is unfinished; outputs grouped per request."""
    per: dict[int, list[StepOutput]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            per.setdefault(out.request_id, []).append(out)
    return per


def text_of(outs: list[StepOutput]) -> str:
    return "".join(o.text or "" for o in outs)


def test_deltas_concatenate_to_the_text_and_stop_at_length(fake_vllm: Any) -> None:
    engine = make_engine()
    add(engine, 1, "Deep", max_new_tokens=5)
    outs = run(engine)[1]
    assert [o.token_id for o in outs] == [2, 3, 4, 5, 6]
    assert [o.text for o in outs] == [" learning", " is", " a", " really", " cool"]
    assert [o.finish_reason for o in outs] == [None, None, None, None, "length"]
    # to_vllm asks for logprobs=1, so every token carries its own log-prob
    assert [o.log_prob for o in outs] == pytest.approx([-0.25, -0.35, -0.45, -0.55, -0.65])
    assert not engine.has_unfinished()


def test_eos_finishes_with_eos_token(fake_vllm: Any) -> None:
    engine = make_engine()
    add(engine, 1, "many")
    outs = run(engine)[1]
    assert [o.token_id for o in outs] == [19, 0]
    assert text_of(outs) == " people"
    assert outs[-1].finish_reason == "eos_token"
    assert 0 in engine.eos_token_ids


def test_stop_string_is_stop_sequence_and_never_streamed(fake_vllm: Any) -> None:
    engine = make_engine()
    add(engine, 1, "Deep", stop_sequences=["really cool"])
    outs = run(engine)[1]
    assert outs[-1].finish_reason == "stop_sequence"
    assert text_of(outs) == " learning is a "
    assert all("really" not in (o.text or "") for o in outs)


def test_stop_token_id_is_eos_token(fake_vllm: Any) -> None:
    engine = make_engine()
    add(engine, 1, "Deep", stop_token_ids=[4])
    outs = run(engine)[1]
    assert outs[-1].token_id == 4
    assert outs[-1].finish_reason == "eos_token"


def test_ignore_eos_token_runs_to_length(fake_vllm: Any) -> None:
    engine = make_engine()
    add(engine, 1, "many", max_new_tokens=4, ignore_eos_token=True)
    outs = run(engine)[1]
    assert [o.token_id for o in outs] == [19, 0, 1, 2]
    assert outs[-1].finish_reason == "length"


def test_release_of_a_running_request_aborts_it(fake_vllm: Any) -> None:
    engine = make_engine()
    add(engine, 7, "Deep", max_new_tokens=20)
    add(engine, 8, "Deep", max_new_tokens=20)
    assert {o.request_id for o in engine.step()} == {7, 8}
    engine.release(7)
    assert engine.engine.aborted == ["7"]
    assert {o.request_id for o in engine.step()} == {8}
    assert engine.has_unfinished()


def test_release_after_finish_does_not_abort(fake_vllm: Any) -> None:
    engine = make_engine()
    add(engine, 1, "many")
    run(engine)
    engine.release(1)
    assert engine.engine.aborted == []


@pytest.mark.parametrize("do_sample", [False, True])
def test_parameters_reach_sampling_params(fake_vllm: Any, do_sample: bool) -> None:
    engine = make_engine()
    p = params(
        do_sample=do_sample,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        seed=3,
        max_new_tokens=7,
        stop_sequences=["x y"],
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.1,
        min_p=0.05,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    engine.add_request(EngineRequest(1, [1], p, "Deep"))
    sp = engine.engine.added["1"]
    expected = fake_vllm.SamplingParams(**to_vllm(p))
    assert sp == expected
    assert (sp.max_tokens, sp.seed, sp.stop) == (7, 3, ["x y"])
    assert (sp.presence_penalty, sp.frequency_penalty, sp.include_stop_str_in_output) == (0.5, 0.25, True)
    # greedy is temperature 0 (vLLM then resets top_p/top_k itself)
    assert (sp.temperature, sp.top_p, sp.top_k) == ((0.7, 0.9, 5) if do_sample else (0.0, 1.0, 0))
    assert sp.logprobs == 1


def test_prompt_is_sent_as_token_ids(fake_vllm: Any) -> None:
    engine = make_engine()
    engine.add_request(EngineRequest(1, [18], params(), "ignored text"))
    outs = run(engine)[1]
    assert [o.token_id for o in outs] == [19, 0]  # continues from id 18, not from the text


def test_several_tokens_in_one_step_become_one_output_each(fake_vllm: Any) -> None:
    engine = make_engine()
    engine.engine.tokens_per_step = 3
    add(engine, 1, "Deep", max_new_tokens=6)
    first = engine.step()
    assert [o.token_id for o in first] == [2, 3, 4]
    assert [o.text for o in first] == [" learning", " is", " a"]  # vLLM's text, cut per token
    assert [o.log_prob for o in first] == pytest.approx([-0.25, -0.35, -0.45])
    second = engine.step()
    assert [o.token_id for o in second] == [5, 6, 7]
    assert [o.text for o in second] == [" really", " cool", " field"]
    assert second[-1].finish_reason == "length" and [o.finish_reason for o in second[:-1]] == [None, None]


@pytest.mark.parametrize("stop", [["growing"], ["cool", "it keeps"]])
def test_several_tokens_get_the_texts_they_would_have_got_one_by_one(fake_vllm: Any, stop: list[str]) -> None:
    """With stop strings vLLM holds back text that could start one: each token's piece is what
    vLLM's text gained with it when tokens come one per step."""
    per_step = {}
    for tokens in (1, 3):
        engine = make_engine()
        engine.engine.tokens_per_step = tokens
        add(engine, 1, "Deep", max_new_tokens=12, stop_sequences=stop)
        per_step[tokens] = run(engine)[1]
    one, three = per_step[1], per_step[3]
    fields = [[(o.token_id, o.text, o.finish_reason) for o in outs] for outs in (one, three)]
    assert fields[0] == fields[1]
    assert "".join(o.text or "" for o in one[:3]) == " learning is a"[: -(max(len(s) for s in stop) - 1)]
    assert one[-1].finish_reason == "stop_sequence"


def test_tokens_our_decoding_disagrees_on_keep_vllms_text_on_the_last(fake_vllm: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine()
    engine.engine.tokens_per_step = 3
    add(engine, 1, "Deep", max_new_tokens=3)
    monkeypatch.setattr(engine, "tokenizer", type("Xs", (), {"decode": lambda self, ids, **kw: "X" * len(ids)})())
    assert [o.text for o in engine.step()] == ["", "", " learning is a"]


def test_requests_vllm_did_not_schedule_get_no_output(fake_vllm: Any) -> None:
    engine = make_engine({"max_rolling_batch_size": "1"})
    add(engine, 1, "many")
    add(engine, 2, "Deep", max_new_tokens=2)
    assert [o.request_id for o in engine.step()] == [1]
    per = run(engine)
    assert [o.token_id for o in per[2]] == [2, 3]


def test_prompt_longer_than_the_model_is_rejected(fake_vllm: Any) -> None:
    engine = make_engine({"max_model_len": "3"})
    assert engine.max_model_len == 3
    with pytest.raises(PromptTooLong, match="maximum model length"):
        add(engine, 1, "a b c d e")


def test_invalid_value_for_vllm_is_invalid_parameter(fake_vllm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    translate = importlib.import_module("djl_handlers.params.translate")
    monkeypatch.setattr(translate, "to_vllm", lambda p: {"top_p": 0.0})
    engine = make_engine()
    with pytest.raises(InvalidParameter, match="top_p"):
        add(engine, 1, "Deep")
    assert not engine.has_unfinished()


def test_key_unknown_to_the_installed_vllm(fake_vllm: Any) -> None:
    from djl_handlers.engines.external.common import fit_kwargs

    assert fit_kwargs(fake_vllm.SamplingParams, {"best_of": None, "n": 1}, "vllm") == {"n": 1}
    with pytest.raises(InvalidParameter, match="best_of=2 is not supported by the installed vllm") as info:
        fit_kwargs(fake_vllm.SamplingParams, {"best_of": 2}, "vllm")
    assert info.value.field == "best_of"


def test_abort_by_the_engine_is_an_error(fake_vllm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine()
    add(engine, 1, "Deep")
    done = fake_vllm.CompletionOutput(0, " learning", [2], None, None, finish_reason="abort")
    monkeypatch.setattr(engine.engine, "step", lambda: [fake_vllm.RequestOutput("1", None, [1], None, [done], True)])
    outs = engine.step()
    assert len(outs) == 1 and outs[0].error is not None and "abort" in outs[0].error
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    ("reason", "stop_reason", "expected"),
    [
        ("length", None, "length"),
        ("stop", None, "eos_token"),
        ("stop", 42, "eos_token"),
        ("stop", "###", "stop_sequence"),
        ("abort", None, "abort"),
        (None, None, None),
    ],
)
def test_finish_reason_table(reason: Any, stop_reason: Any, expected: Any) -> None:
    from djl_handlers.engines.external.vllm import map_finish_reason

    assert map_finish_reason(reason, stop_reason) == expected


def test_engine_args_from_config(fake_vllm: Any) -> None:
    engine = make_engine(
        {
            "dtype": "bf16",
            "max_rolling_batch_size": "8",
            "max_model_len": "1024",
            "enforce_eager": "true",
            "gpu_memory_utilization": "0.5",
            "max_rolling_batch_prefill_tokens": "2048",
            "trust_remote_code": "true",
        }
    )
    args = engine.engine.engine_args
    assert (args.model, args.dtype, args.max_num_seqs, args.max_model_len) == ("toy", "bfloat16", 8, 1024)
    assert (args.enforce_eager, args.gpu_memory_utilization, args.max_num_batched_tokens) == (True, 0.5, 2048)
    assert args.trust_remote_code is True and args.tensor_parallel_size == 1


def test_lmi_dist_is_served_by_vllm_and_says_so(fake_vllm: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="djl_handlers.engines.external.vllm_config"):
        engine = make_engine(engine="lmi-dist")
    assert "option.rolling_batch=lmi-dist is served by vLLM (lmi_dist is not installed)" in caplog.text
    assert "vLLM" in engine.name
    add(engine, 1, "many")
    assert run(engine)[1][-1].finish_reason == "eos_token"


def test_through_the_rolling_batch(fake_vllm: Any) -> None:
    import json

    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.request.records import Request
    from djl_handlers.scheduling.rolling import RollingBatch

    engine = make_engine()
    batch = RollingBatch(engine, lambda r: get_formatter("json", stream=False))
    p = GenerationParameters.from_dict({"stop_sequences": ["cool"], "details": True}, engine="vllm")
    batch.add_request(Request(prompt="Deep", params=p, inputs="Deep"))
    batch.add_request(Request(prompt="many", params=params(details=True), inputs="many"))
    records: dict[int, str] = {0: "", 1: ""}
    live = [0, 1]
    for _ in range(50):
        if not live:
            break
        results = batch.step()
        for index, (record, _) in zip(list(live), results, strict=True):
            records[index] += record["data"]
            if record["last"]:
                live.remove(index)
    first, second = json.loads(records[0]), json.loads(records[1])
    assert first["generated_text"] == " learning is a really "
    assert first["details"]["finish_reason"] == "stop_sequence"
    assert first["details"]["generated_tokens"] == 5
    assert second["generated_text"] == " people"
    assert second["details"]["finish_reason"] == "eos_token"
    assert not engine.has_unfinished() and engine.engine.aborted == []


@pytest.mark.parametrize(("keep", "text"), [(False, " learning is a really "), (True, " learning is a really cool")])
def test_stop_string_rule_through_the_rolling_batch(fake_vllm: Any, keep: bool, text: str) -> None:
    """docs/parameters.md: removed by default, kept with include_stop_str_in_output (streamed too)."""
    import json

    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.request.records import Request
    from djl_handlers.scheduling.rolling import RollingBatch

    batch = RollingBatch(make_engine(), lambda r: get_formatter("jsonlines", stream=True))
    p = GenerationParameters.from_dict({"stop_sequences": ["cool"], "include_stop_str_in_output": keep},
                                       engine="vllm")
    batch.add_request(Request(prompt="Deep", params=p, inputs="Deep", stream=True))
    data = ""
    for _ in range(50):
        ((record, _),) = batch.step()
        data += record["data"]
        if record["last"]:
            break
    lines = [json.loads(line) for line in data.splitlines()]
    assert "".join(line["token"]["text"] for line in lines) == text == lines[-1]["generated_text"]


# -- LoRA adapters: one LoRARequest per registered adapter, per request -------------------------------
def _adapter_dir(tmp_path: Path, name: str, rank: int) -> str:
    import json

    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 8}))
    return str(folder)


def test_lora_options_reach_engine_args_and_requests_carry_their_lora(fake_vllm: Any, tmp_path: Path) -> None:
    from djl_handlers.lora.registry import AdapterLimit, AdapterNotFound, AdapterSpec

    engine = make_engine({"enable_lora": "true", "max_loras": "2", "max_lora_rank": "8", "max_cpu_loras": "3"})
    args = engine.engine.engine_args
    assert (args.enable_lora, args.max_loras, args.max_lora_rank, args.max_cpu_loras) == (True, 2, 8, 3)
    engine.load_adapter(AdapterSpec("a", _adapter_dir(tmp_path, "a", 4)))
    engine.load_adapter(AdapterSpec("b", _adapter_dir(tmp_path, "b", 8), pin=True))
    assert engine.engine.list_loras() == {1, 2} and engine.engine.pinned == {2}
    engine.load_adapter(AdapterSpec("a", engine.loras.requests["a"].lora_path))  # replayed registration
    assert engine.loras.requests["a"].lora_int_id == 1 and engine.engine.list_loras() == {1, 2}
    with pytest.raises(AdapterLimit, match="max_lora_rank"):
        engine.load_adapter(AdapterSpec("big", _adapter_dir(tmp_path, "big", 16)))
    for rid, name in enumerate(["a", None, "b", "a"]):
        engine.add_request(EngineRequest(rid, engine.tokenizer.encode("hi"), params(max_new_tokens=2), "hi", name))
    run(engine)
    chosen = {rid: getattr(lora, "lora_name", None) for rid, lora in engine.engine.lora_of.items()}
    assert chosen == {"0": "a", "1": None, "2": "b", "3": "a"}
    assert engine.engine.lora_of["0"].lora_int_id == 1 and engine.engine.lora_of["0"].lora_path.endswith("/a")
    engine.unload_adapter("a")
    assert engine.engine.list_loras() == {2}
    with pytest.raises(AdapterNotFound, match="'a'"):
        engine.add_request(EngineRequest(9, engine.tokenizer.encode("hi"), params(), "hi", "a"))


def test_lora_disabled_refuses_adapters(fake_vllm: Any, tmp_path: Path) -> None:
    from djl_handlers.lora.registry import AdapterError, AdapterSpec

    engine = make_engine()
    assert not engine.engine.engine_args.enable_lora
    with pytest.raises(AdapterError, match="enable_lora"):
        engine.load_adapter(AdapterSpec("a", _adapter_dir(tmp_path, "a", 4)))


# -- several samples (n > 1): vLLM's own n, one CompletionOutput.index per sample ------------------
def _sampled(engine: Any, rid: int, sample_ids: tuple[int, ...], **kwargs: Any) -> EngineRequest:
    p = params(do_sample=True, temperature=1.0, seed=11, n=1 + len(sample_ids), **kwargs)
    return EngineRequest(rid, engine.tokenizer.encode("Deep"), p, "Deep", sample_ids=sample_ids)


def test_samples_are_one_vllm_request_reported_under_their_own_ids(fake_vllm: Any) -> None:
    engine = make_engine()
    engine.add_request(_sampled(engine, 1, (5, 6), max_new_tokens=6))
    assert engine.engine.added["1"].n == 3 and list(engine.engine.added) == ["1"]  # one request, vLLM's n
    per = run(engine)
    assert sorted(per) == [1, 5, 6]
    for outs in per.values():
        assert len(outs) == 6 and [o.finish_reason for o in outs] == [None] * 5 + ["length"]
    # vLLM seeds sample i with seed + i: each sample equals a one-sample request with that seed
    for sample_id, seed in ((1, 11), (5, 12), (6, 13)):
        alone = make_engine()
        alone.add_request(EngineRequest(9, alone.tokenizer.encode("Deep"),
                                        params(do_sample=True, temperature=1.0, seed=seed, max_new_tokens=6), "Deep"))
        assert [o.token_id for o in per[sample_id]] == [o.token_id for o in run(alone)[9]]
    assert engine.sample_seed(11, 2) == 13 and engine.sample_seed(None, 2) is None
    assert not engine.has_unfinished() and engine.engine.aborted == []


def test_released_samples_get_nothing_and_the_request_aborts_when_all_are_released(fake_vllm: Any) -> None:
    engine = make_engine()
    engine.add_request(_sampled(engine, 1, (5, 6), max_new_tokens=20))
    assert {o.request_id for o in engine.step()} == {1, 5, 6}
    engine.release(5)  # one sample ended by a rule of ours: its siblings go on
    assert {o.request_id for o in engine.step()} == {1, 6}
    engine.release(1)
    assert engine.engine.aborted == [] and engine.has_unfinished()
    engine.release(6)
    assert engine.engine.aborted == ["1"] and not engine.has_unfinished()
    assert not engine.engine.has_unfinished_requests()  # every child aborted in vLLM


def test_samples_through_the_rolling_batch_are_lmi_best_of_sequences(fake_vllm: Any) -> None:
    from djl_handlers.service import InferenceService
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    service = InferenceService("vllm")
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"model_id": "toy", "rolling_batch": "vllm"}) is None
    body = {"inputs": "Deep", "parameters": {"n": 3, "do_sample": True, "seed": 4, "max_new_tokens": 5}}
    sampled, greedy = driver.submit(json_request(body)), driver.submit(json_request({**body, "parameters": {"n": 2}}))
    driver.run()
    answer = json.loads(sampled.text)
    assert len(answer["details"]["best_of_sequences"]) == 2
    assert all(seq["generated_tokens"] == 5 for seq in answer["details"]["best_of_sequences"])
    assert greedy.code == 400 and "parameters.n must be 1 when decoding greedily" in (greedy.error or "")
