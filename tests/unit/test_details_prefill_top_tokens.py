"""``decoder_input_details`` (details.prefill) and ``top_n_tokens`` (details.top_tokens) on the HF
engine: the numbers against a direct computation on the tiny model, the formatter shapes (LMI and
TGI), and the whole pipeline through the service driven like DJL's Java loop."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.dialects.registry import get_formatter  # noqa: E402
from djl_handlers.dialects.tgi.request import tgi_to_lmi  # noqa: E402
from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import InvalidParameter  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402
from djl_handlers.params.translate import SUPPORT  # noqa: E402
from djl_handlers.request.records import Request, RequestOutput, Token  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, tiny_dir

PROMPTS = [
    "The capital of France is a city that",
    "Hello there",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen",
]


def direct_prompt_log_probs(model: Any, ids: list[int]) -> list[float]:
    """log P(ids[j] | ids[:j]) for j >= 1, from one plain forward of the prompt alone."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    lsm = torch.log_softmax(logits, dim=-1)
    return [float(lsm[j - 1, ids[j]]) for j in range(1, len(ids))]


def reference(model: Any, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def run(engine: HFEngine, requests: list[EngineRequest]) -> dict[int, list[StepOutput]]:
    """Add every request, step until each has max_new_tokens outputs (released then)."""
    got: dict[int, list[StepOutput]] = {r.request_id: [] for r in requests}
    for req in requests:
        engine.add_request(req)
    for _ in range(200):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(out)
            if len(got[out.request_id]) == requests[out.request_id].params.max_new_tokens:
                engine.release(out.request_id)
    assert not engine.has_unfinished()
    return got


# --------------------------------------------------------------------------- engine numbers


@pytest.mark.parametrize("prefill_budget", [512, 5])  # 5: the long prompts are prefilled in chunks
def test_prompt_log_probs_equal_a_direct_forward(tiny_model: Any, prefill_budget: int) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_prefill_tokens=prefill_budget)
    asks = [True, False, True]
    requests = [
        EngineRequest(i, tok.encode(p), GenerationParameters(max_new_tokens=4, decoder_input_details=a))
        for i, (p, a) in enumerate(zip(PROMPTS, asks, strict=True))
    ]
    assert max(len(r.prompt_ids) for r in requests) > prefill_budget or prefill_budget == 512
    got = run(engine, requests)
    for req, asked in zip(requests, asks, strict=True):
        outs = got[req.request_id]
        ids = list(req.prompt_ids)
        assert all(o.prompt_logprobs is None for o in outs[1:])  # first output only
        # the features never change the tokens: greedy still equals generate() alone
        assert [o.token_id for o in outs] == reference(model, ids, 4)
        if not asked:
            assert outs[0].prompt_logprobs is None
            continue
        lps = list(outs[0].prompt_logprobs or [])
        assert len(lps) == len(ids) and lps[0] is None
        expected = direct_prompt_log_probs(model, ids)
        assert lps[1:] == pytest.approx(expected, abs=1e-4)
        assert all(lp is not None and lp <= 0.0 for lp in lps[1:])


def test_top_tokens_start_with_the_greedy_token_and_its_log_prob(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    requests = [
        EngineRequest(0, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=5, top_n_tokens=3)),
        EngineRequest(1, tok.encode(PROMPTS[1]), GenerationParameters(max_new_tokens=5)),
    ]
    got = run(engine, requests)
    assert all(o.top_tokens is None for o in got[1])
    for out in got[0]:
        top = list(out.top_tokens or [])
        assert len(top) == 3
        assert top[0] == (out.token_id, out.log_prob)  # same distribution, bit for bit
        values = [lp for _, lp in top]
        assert values == sorted(values, reverse=True) and len({t for t, _ in top}) == 3
    # the first step's alternatives are the prompt's next-token distribution
    ids = list(requests[0].prompt_ids)
    with torch.inference_mode():
        lsm = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
    want = torch.topk(lsm, 3)
    first = list(got[0][0].top_tokens or [])
    assert [t for t, _ in first] == want.indices.tolist()
    assert [lp for _, lp in first] == pytest.approx(want.values.tolist(), abs=1e-4)


def test_top_tokens_when_sampling_come_from_the_model_distribution(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    params = GenerationParameters(max_new_tokens=6, top_n_tokens=20, do_sample=True, temperature=1.5, seed=7)
    got = run(engine, [EngineRequest(0, tok.encode(PROMPTS[1]), params)])
    for out in got[0]:
        top = dict(out.top_tokens or [])
        assert len(top) == 20
        if out.token_id in top:  # a sampled token among the top 20 has the same log-prob there
            assert top[out.token_id] == out.log_prob
        assert out.log_prob is not None and out.log_prob <= max(top.values())


# --------------------------------------------------------------------------- formatter shapes


def finished_output(**params: Any) -> RequestOutput:
    gp = GenerationParameters(**params)
    out = RequestOutput(Request(prompt="Hi you", params=gp, inputs="Hi you"), prompt_tokens=2)
    out.prefill = [Token(10, "Hi", None), Token(11, " you", -2.5)]
    out.tokens = [Token(5, " there", -0.5), Token(6, "!", -0.25)]
    out.new_tokens = list(out.tokens)
    out.top_tokens = [
        [Token(5, " there", -0.5), Token(7, " all", -1.5)],
        [Token(6, "!", -0.25), Token(0, "", -3.0, True)],
    ]
    out.finished, out.finish_reason = True, "length"
    return out


def test_json_details_have_prefill_and_top_tokens() -> None:
    body = json.loads(get_formatter("json", stream=False)(
        finished_output(details=True, decoder_input_details=True, top_n_tokens=2)))
    details = body["details"]
    assert details["prefill"] == [
        {"id": [10], "text": "Hi", "log_prob": None},
        {"id": [11], "text": " you", "log_prob": -2.5},
    ]
    assert details["top_tokens"] == [
        [{"id": [5], "text": " there", "log_prob": -0.5}, {"id": [7], "text": " all", "log_prob": -1.5}],
        [{"id": [6], "text": "!", "log_prob": -0.25}, {"id": [0], "text": "", "log_prob": -3.0, "special_token": True}],
    ]
    assert [t["id"] for t in details["tokens"]] == [[5], [6]]


def test_json_details_without_the_options_are_unchanged() -> None:
    body = json.loads(get_formatter("json", stream=False)(finished_output(details=True)))
    assert set(body["details"]) == {"finish_reason", "generated_tokens", "inputs", "tokens"}


def test_jsonlines_closing_details_carry_prefill_and_top_tokens() -> None:
    text = get_formatter("jsonlines", stream=True)(finished_output(details=True, decoder_input_details=True,
                                                                    top_n_tokens=2))
    lines = [json.loads(x) for x in text.splitlines()]
    assert "details" not in lines[0]
    details = lines[-1]["details"]
    assert "tokens" not in details
    assert details["prefill"][0]["log_prob"] is None and len(details["top_tokens"]) == 2


def test_tgi_details_prefill_and_top_tokens() -> None:
    body = json.loads(get_formatter("tgi", stream=False)(
        finished_output(details=True, decoder_input_details=True, top_n_tokens=2)))
    details = body[0]["details"]
    assert details["prefill"] == [
        {"id": 10, "text": "Hi", "logprob": None},
        {"id": 11, "text": " you", "logprob": -2.5},
    ]
    assert details["top_tokens"][1] == [
        {"id": 6, "text": "!", "logprob": -0.25, "special": False},
        {"id": 0, "text": "", "logprob": -3.0, "special": True},
    ]
    assert list(details) == ["finish_reason", "generated_tokens", "seed", "prefill", "tokens", "top_tokens"]
    plain = json.loads(get_formatter("tgi", stream=False)(finished_output(details=True)))[0]["details"]
    assert plain["prefill"] == [] and "top_tokens" not in plain


def test_tgi_stream_events_carry_their_top_tokens() -> None:
    text = get_formatter("tgi_stream", stream=True)(finished_output(details=True, top_n_tokens=2))
    events = [json.loads(chunk[len("data:"):]) for chunk in text.split("\n\n") if chunk]
    assert [list(e) for e in events] == [["index", "token", "top_tokens", "generated_text", "details"]] * 2
    assert [t["id"] for t in events[0]["top_tokens"]] == [5, 7]
    assert [t["id"] for t in events[1]["top_tokens"]] == [6, 0]
    plain = get_formatter("tgi_stream", stream=True)(finished_output(details=True))
    assert "top_tokens" not in plain


def test_support_table_and_tgi_stream_rule() -> None:
    for engine in ("huggingface", "deepspeed"):
        assert SUPPORT[engine]["decoder_input_details"] == "native"
        assert SUPPORT[engine]["top_n_tokens"] == "native"
    p = GenerationParameters.from_dict({"decoder_input_details": True, "top_n_tokens": 20}, "huggingface")
    assert p.decoder_input_details and p.top_n_tokens == 20
    with pytest.raises(InvalidParameter):
        GenerationParameters.from_dict({"top_n_tokens": 21}, "huggingface")
    with pytest.raises(InvalidParameter, match="streaming"):
        tgi_to_lmi({"inputs": "x", "parameters": {"decoder_input_details": True}}, stream=True)


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def driver_factory(tiny_dir: Any) -> Any:
    from djl_handlers.service import InferenceService
    from djl_handlers.testing.java_loop import RollingBatchDriver

    service = InferenceService("huggingface")
    options = {"model_id": str(tiny_dir), "rolling_batch": "auto", "dtype": "fp32", "max_prefill_tokens": "6"}
    driver = RollingBatchDriver(service.handle)
    assert driver.init(options) is None
    return lambda: RollingBatchDriver(service.handle)


def test_service_json_with_prefill_and_top_tokens(driver_factory: Any, tiny_model: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    model, tok = tiny_model
    driver = driver_factory()
    params = {"max_new_tokens": 4, "details": True, "decoder_input_details": True, "top_n_tokens": 2}
    asked = driver.submit(json_request({"inputs": PROMPTS[0], "parameters": params}))
    plain = driver.submit(json_request({"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 3, "details": True}}))
    stream = driver.submit(json_request({"inputs": PROMPTS[1], "stream": True, "parameters": params}))
    driver.run()
    details = json.loads(asked.text)["details"]
    ids = tok.encode(PROMPTS[0])
    assert [t["id"] for t in details["prefill"]] == [[i] for i in ids]  # long prompt: chunked prefill
    assert "".join(t["text"] for t in details["prefill"]) == PROMPTS[0]
    assert details["prefill"][0]["log_prob"] is None
    lps = [t["log_prob"] for t in details["prefill"][1:]]
    assert lps == pytest.approx(direct_prompt_log_probs(model, ids), abs=1e-4)
    assert len(details["top_tokens"]) == details["generated_tokens"] == 4
    for token, top in zip(details["tokens"], details["top_tokens"], strict=True):
        assert len(top) == 2 and top[0] == token  # greedy: the chosen token is the most likely
    assert set(json.loads(plain.text)["details"]) == {"finish_reason", "generated_tokens", "inputs", "tokens"}
    last = json.loads(stream.text.splitlines()[-1])
    assert len(last["details"]["prefill"]) == len(tok.encode(PROMPTS[1]))
    assert len(last["details"]["top_tokens"]) == 4


def test_service_tgi_shapes(driver_factory: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    driver = driver_factory()
    params = {"max_new_tokens": 3, "details": True, "decoder_input_details": True, "top_n_tokens": 2}
    req = driver.submit(json_request({"inputs": PROMPTS[1], "parameters": params}, **{"X-Djl-Handlers-Api": "tgi"}))
    driver.run()
    details = json.loads(req.text)[0]["details"]
    assert details["prefill"][0]["logprob"] is None and set(details["prefill"][0]) == {"id", "text", "logprob"}
    assert [len(t) for t in details["top_tokens"]] == [2, 2, 2]
    assert [t[0]["id"] for t in details["top_tokens"]] == [t["id"] for t in details["tokens"]]
