"""Prompt-lookup speculative decoding in the HF engine: the option, the lookup, greedy outputs equal to
plain decoding and ``generate()``, the rejection rule's distribution, and rows that must stay exact."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.config.speculative import NgramOptions  # noqa: E402
from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.engines.hf.lookup import lookup  # noqa: E402
from djl_handlers.engines.hf.speculation_policy import StepCost  # noqa: E402
from djl_handlers.engines.hf.speculative import Speculator, accept_or_resample  # noqa: E402
from djl_handlers.errors import ConfigError  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, tiny_dir, embedded_dir

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
# prompts whose text repeats: the lookup finds candidates from the first decode step on
def candidates(context: list[int], k: int, low: int, high: int) -> list[int]:
    """:func:`lookup`'s candidates, without the match length."""
    return lookup(context, k, low, high)[0]


PROMPTS = [
    "one two three one two three one two three one two",
    "The cat sat on the mat. The cat sat on the mat. The cat",
    "Hello there",
    "a b c d e f g a b c d e f g a b c",
    "Deep learning is deep learning is deep",
]


# -- the option -------------------------------------------------------------------------------------------
def hf_config(**options: str) -> ServingConfig:
    return ServingConfig.from_properties({"model_id": "/m", "rolling_batch": "scheduler", **options})


def test_option_off_by_default_and_vllm_defaults() -> None:
    assert hf_config().hf.speculative is None
    spec = hf_config(speculative_config='{"method": "ngram", "num_speculative_tokens": 3}').hf.speculative
    assert spec == NgramOptions(3, 5, 5)  # vLLM: both lookups 5 when neither is given
    one = hf_config(speculative_config='{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}')
    assert one.hf.speculative == NgramOptions(2, 4, 4)  # one given sets the other
    assert hf_config(speculative_config=NGRAM).hf.speculative == NgramOptions(4, 3, 1)


@pytest.mark.parametrize(("value", "words"), [
    ('{"method": "eagle", "num_speculative_tokens": 2}', ["eagle", "only \"ngram\""]),
    ('{"model": "/draft", "num_speculative_tokens": 2}', ["/draft", "only \"ngram\""]),
    ('{"method": "ngram"}', ["num_speculative_tokens is required"]),
    ('{"method": "ngram", "num_speculative_tokens": 0}', ["num_speculative_tokens=0"]),
    ('{"method": "ngram", "num_speculative_tokens": "3"}', ["num_speculative_tokens='3'"]),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
     ["prompt_lookup_min=4 must be <= prompt_lookup_max=2"]),
    ('{"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}',
     ["draft_tensor_parallel_size"]),
    ('{"method": ngram}', ["not valid JSON"]),
    ("[1, 2]", ["JSON object"]),
])
def test_option_errors_name_the_field(value: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        hf_config(speculative_config=value)
    assert err.value.field == "option.speculative_config"
    for word in words:
        assert word in str(err.value)


def test_vllm_gets_the_object_unchanged(tmp_path: Path) -> None:
    from djl_handlers.engines.external.vllm_config import engine_args_kwargs

    value = '{"model": "/draft", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}'
    props = {"model_id": str(tmp_path), "rolling_batch": "vllm"}
    config = ServingConfig.from_properties({**props, "speculative_config": value}, engine="vllm")
    assert engine_args_kwargs(config)["speculative_config"] == {
        "model": "/draft", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}
    # the HF entry point hands rolling_batch=vllm to vLLM: its draft model is not the HF engine's concern
    assert ServingConfig.from_properties({**props, "speculative_config": value}).hf.speculative is None
    plain = ServingConfig.from_properties(props, engine="vllm")
    assert "speculative_config" not in engine_args_kwargs(plain)


# -- the lookup -------------------------------------------------------------------------------------------
def test_lookup_takes_the_longest_then_latest_match() -> None:
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 1, 9, 6, 7, 2, 6, 7]
    assert candidates(context, 3, 1, 3) == [2, 6, 7]  # "6 7" occurs at 1-2 and 5-6: the latest wins
    assert candidates([5, 6, 7, 1, 9, 8, 7, 2, 6, 7], 3, 1, 3) == [1, 9, 8]  # "6 7" beats the later "7"
    assert candidates(context, 1, 1, 3) == [2]
    assert candidates(context, 3, 3, 3) == []  # no earlier "2 6 7"
    assert candidates([1, 2, 3], 3, 1, 3) == []
    assert candidates([4, 4], 3, 1, 3) == [4]  # overlapping occurrence, cut at the context's end


# -- greedy: byte for byte --------------------------------------------------------------------------------
def run(engine: HFEngine, requests: list[EngineRequest], joins: list[int]) -> dict[int, list[StepOutput]]:
    """Drive the engine like the scheduler: join at a step, release at max_new_tokens (outputs past it
    in the same step are dropped, as the slot drops them)."""
    got: dict[int, list[StepOutput]] = {r.request_id: [] for r in requests}
    limits = {r.request_id: r.params.max_new_tokens for r in requests}
    step = 0
    while step <= max(joins) or engine.has_unfinished():
        for req, join in zip(requests, joins, strict=True):
            if join == step:
                engine.add_request(req)
        for out in engine.step():
            mine = got[out.request_id]
            if len(mine) < limits[out.request_id] and (not mine or mine[-1].error is None):
                mine.append(out)
                if out.error is not None or len(mine) == limits[out.request_id]:
                    engine.release(out.request_id)
        step += 1
        assert step < 500, "engine did not finish"
    return got


def requests(tok: Any, news: list[int], **params: Any) -> list[EngineRequest]:
    return [EngineRequest(i, tok.encode(p), GenerationParameters(max_new_tokens=n, **params))
            for i, (p, n) in enumerate(zip(PROMPTS, news, strict=True))]


def speculating(model: Any, tok: Any, k: int = 4, cost: StepCost | None = None, **kwargs: Any) -> HFEngine:
    """An engine that verifies every candidate (``cost``: verifying is free), or as ``cost`` decides."""
    engine = HFEngine(model, tok, **kwargs)
    engine.speculator = Speculator(NgramOptions(k, 3, 1), cost or StepCost.free())
    return engine


def compare(got: dict[int, list[StepOutput]], want: dict[int, list[StepOutput]], bits: bool = True) -> None:
    """Equal tokens; with ``bits`` also equal log-probs and top tokens (else within float rounding)."""
    for rid, outs in want.items():
        assert [o.token_id for o in got[rid]] == [o.token_id for o in outs], rid
        if bits:
            assert [(o.log_prob, o.top_tokens) for o in got[rid]] == [(o.log_prob, o.top_tokens) for o in outs], rid
        else:
            assert [o.log_prob for o in got[rid]] == pytest.approx([o.log_prob for o in outs], abs=1e-4), rid


def test_greedy_equals_plain_decoding_and_generate(tiny_model: Any) -> None:
    model, tok = tiny_model
    news, joins = [12, 10, 9, 14, 11], [0, 0, 1, 3, 3]
    plain = run(HFEngine(model, tok), requests(tok, news), joins)
    engine = speculating(model, tok)
    got = run(engine, requests(tok, news), joins)
    # this model object runs torch's SDPA and linear layers, whose [B, 1 + K] forward differs from the
    # [B, 1] one in the last bits: the tokens are equal, the log-probs to rounding (bit for bit with the
    # CPU kernels the engine installs: the next test)
    compare(got, plain, bits=False)
    stats = engine.spec_decode_stats()
    assert stats["spec_decode_num_accepted_tokens"] > 0  # several tokens per step happened
    assert stats["spec_decode_num_drafts"] > 0 and stats["spec_decode_tokens_per_step"] > 1.0
    assert 0 < stats["spec_decode_acceptance_rate"] <= 1
    assert not engine.has_unfinished() and engine.kv_shape == (0, 0)
    for req in requests(tok, news):
        with torch.inference_mode():
            out = model.generate(torch.tensor([list(req.prompt_ids)]), max_new_tokens=req.params.max_new_tokens,
                                 min_new_tokens=req.params.max_new_tokens, do_sample=False)
        assert [o.token_id for o in got[req.request_id]] == out[0, len(req.prompt_ids):].tolist()


def test_greedy_with_the_cpu_kernels_equals_plain(tiny_dir: Path) -> None:
    """The engine as served (ragged attention, oneDNN linear layers, fused norm and rotary)."""
    props = {"model_id": str(tiny_dir), "rolling_batch": "scheduler", "dtype": "fp32", "cpu_threads": "fixed"}
    plain_engine = HFEngine.from_config(ServingConfig.from_properties(props))
    engine = HFEngine.from_config(ServingConfig.from_properties({**props, "speculative_config": NGRAM}))
    assert engine.speculator is not None and plain_engine.speculator is None
    tok = engine.tokenizer
    news, joins = [12, 10, 9, 14, 11], [0, 1, 1, 2, 4]
    compare(run(engine, requests(tok, news, details=True), joins),
            run(plain_engine, requests(tok, news, details=True), joins))
    assert engine.spec_decode_stats()["spec_decode_num_accepted_tokens"] > 0


@pytest.mark.parametrize("params", [
    {"repetition_penalty": 1.3},
    {"min_new_tokens": 8},
    {"top_n_tokens": 3},
])
def test_processed_and_top_token_rows_equal_plain(tiny_model: Any, params: dict[str, Any]) -> None:
    model, tok = tiny_model
    news, joins = [10, 8, 9, 12, 10], [0, 0, 2, 2, 3]
    engine = speculating(model, tok)
    compare(run(engine, requests(tok, news, **params), joins),
            run(HFEngine(model, tok), requests(tok, news, **params), joins), bits=False)
    assert engine.spec_decode_stats()["spec_decode_num_draft_tokens"] > 0


def test_candidates_stop_at_max_new_tokens(tiny_model: Any) -> None:
    """A row never gets tokens past max_new_tokens from one step, so the KV never outgrows its bound."""
    model, tok = tiny_model
    engine = speculating(model, tok, k=8)
    engine.add_request(EngineRequest(1, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=3)))
    counts = []
    while engine.has_unfinished():
        outs = engine.step()
        counts.append(len(outs))
        if sum(counts) >= 3:
            engine.release(1)
    assert sum(counts) == 3


# -- sampling: the distribution is unchanged -----------------------------------------------------------------
def tv(a: Counter[Any], b: Counter[Any]) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def test_rejection_rule_keeps_the_distribution() -> None:
    probs = torch.tensor([0.05, 0.4, 0.25, 0.3, 0.0])
    generator = torch.Generator().manual_seed(7)
    draws = 20000
    want = Counter({i: float(p) * draws for i, p in enumerate(probs.tolist())})
    for candidate in (1, 3, 4):  # likely, less likely, impossible
        got = Counter(accept_or_resample(probs, candidate, generator)[0] for _ in range(draws))
        assert tv(got, want) < 0.02, candidate
        assert got[4] == 0
    # the bound fails for a wrong rule: always keeping the candidate
    assert tv(Counter({3: draws}), want) > 0.5


def test_sampled_tokens_have_the_plain_distribution(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many unseeded requests with and without speculation, given the same generator seeds (the engine's
    random seeds, made repeatable here; a client's seed turns speculation off for its row): the first
    token (prefill) and every token of a row without candidates are the same draws, so equal; the second
    token of the rows whose first token was in the prompt (decided by verification) has the plain
    distribution within a loose total-variation bound that a wrong rule (keeping every candidate)
    exceeds. A repetition penalty below 1 favours the prompt's tokens, so the tiny model's candidates
    are often likely."""
    from djl_handlers.engines.hf import sampling

    model, tok = tiny_model
    prompt = tok.encode("a b c a b c a b")
    params = {"do_sample": True, "top_k": 4, "temperature": 3.0, "repetition_penalty": 0.2, "max_new_tokens": 3}
    count = 200

    class Seeds:
        """Stands in for ``secrets`` in the sampler: seeds far apart (the first draws of consecutive seeds
        are not independent enough), the same sequence for each engine."""

        def __init__(self) -> None:
            self.draw = random.Random(0)

        def randbits(self, bits: int) -> int:
            return self.draw.getrandbits(min(bits, 62))

    def tokens(engine: HFEngine) -> list[list[int]]:
        monkeypatch.setattr(sampling, "secrets", Seeds())
        reqs = [EngineRequest(i, prompt, GenerationParameters(**params)) for i in range(count)]
        got = run(engine, reqs, [0] * len(reqs))
        return [[o.token_id for o in got[i]] for i in range(count)]

    engine = speculating(model, tok, max_batch_size=count)
    spec, plain = tokens(engine), tokens(HFEngine(model, tok, max_batch_size=count))
    assert [t[0] for t in spec] == [t[0] for t in plain]
    verified = [i for i in range(count) if spec[i][0] in prompt]  # its last token occurs earlier: candidates
    assert len(verified) > count // 4 and engine.spec_decode_stats()["spec_decode_num_drafts"] >= len(verified)
    assert [spec[i][1] for i in range(count) if i not in verified] == \
        [plain[i][1] for i in range(count) if i not in verified]
    assert 0.1 < engine.spec_decode_stats()["spec_decode_acceptance_rate"] < 0.9
    second_spec, second_plain = Counter(spec[i][1] for i in verified), Counter(plain[i][1] for i in verified)
    assert tv(second_spec, second_plain) < 0.2
    # no token dominates, so a rule that kept every candidate would move the distribution past the bound
    assert max(second_plain.values()) / len(verified) < 0.6


# -- rows that verify no candidates, or speculate with their own weights ------------------------------------
def test_seeded_sampling_rows_verify_nothing_and_answer_as_plain(tiny_model: Any) -> None:
    """Rows that sample with a client's seed beside greedy rows that speculate: no candidates for them, so
    their tokens equal the same seeds without speculation, and equal again in a batch of other neighbours."""
    model, tok = tiny_model
    prompt = tok.encode("a b c a b c a b c a b")
    seeded = {"do_sample": True, "top_k": 4, "temperature": 1.5, "max_new_tokens": 10}

    def reqs(neighbours: int) -> list[EngineRequest]:
        out = requests(tok, [12] * len(PROMPTS))[:neighbours]
        out += [EngineRequest(neighbours + i, prompt, GenerationParameters(seed=100 + i, **seeded)) for i in range(4)]
        return out

    def seeded_tokens(got: dict[int, list[StepOutput]], neighbours: int) -> list[list[int]]:
        return [[o.token_id for o in got[neighbours + i]] for i in range(4)]

    engine = speculating(model, tok)
    spec = seeded_tokens(run(engine, reqs(3), [0] * 7), 3)
    assert engine.spec_decode_stats()["spec_decode_num_accepted_tokens"] > 0  # the greedy rows did speculate
    assert spec == seeded_tokens(run(HFEngine(model, tok), reqs(3), [0] * 7), 3)
    assert spec == seeded_tokens(run(speculating(model, tok), reqs(1), [0] * 5), 1)


def test_grammar_rows_verify_nothing_and_answer_as_plain(tiny_model: Any) -> None:
    """A constrained row next to speculating rows: no candidates for it, its tokens as without speculation."""
    pytest.importorskip("xgrammar")
    model, tok = tiny_model
    news, joins = [12, 10, 9, 14, 11], [0, 0, 0, 1, 1]

    def reqs() -> list[EngineRequest]:
        out = requests(tok, news)
        guided = GenerationParameters.from_dict({"max_new_tokens": 9, "guided_regex": "(ab){2,6}c"})
        out[2] = EngineRequest(2, out[2].prompt_ids, guided)
        return out

    engine = speculating(model, tok)
    got = run(engine, reqs(), joins)
    compare(got, run(HFEngine(model, tok), reqs(), joins), bits=False)
    assert tok.decode([o.token_id for o in got[2]]).startswith("abab")
    assert engine.spec_decode_stats()["spec_decode_num_accepted_tokens"] > 0  # the others did speculate


def test_lora_rows_speculate_with_their_adapter(tiny_model: Any, tmp_path: Path) -> None:
    import copy

    from lora_adapters import ATTENTION, make_adapter

    from djl_handlers.engines.hf.lora import LoraSet
    from djl_handlers.lora.registry import AdapterSpec

    model, tok = tiny_model
    folder = make_adapter(model, tmp_path / "a", seed=1, rank=4, targets=ATTENTION)

    def engine_with(spec: bool) -> HFEngine:
        engine = HFEngine(copy.deepcopy(model), tok)
        engine.lora = LoraSet(engine.model, max_loras=2, max_lora_rank=16)
        engine.load_adapter(AdapterSpec("a", str(folder)))
        if spec:
            engine.speculator = Speculator(NgramOptions(4, 3, 1), StepCost.free())
        return engine

    def reqs() -> list[EngineRequest]:
        return [EngineRequest(r.request_id, r.prompt_ids, r.params, adapter="a" if r.request_id % 2 else None)
                for r in requests(tok, [12, 10, 9, 14, 11])]

    joins = [0, 0, 1, 1, 2]
    engine = engine_with(True)
    compare(run(engine, reqs(), joins), run(engine_with(False), reqs(), joins), bits=False)
    assert engine.spec_decode_stats()["spec_decode_num_accepted_tokens"] > 0


# -- when verifying does not pay -----------------------------------------------------------------------------
def test_declined_steps_keep_greedy_output_bit_for_bit_and_the_counters_true(tiny_dir: Path) -> None:
    """A cost model under which verifying is dear (a forward's fixed cost worth 8 tokens: with 5 rows
    a [5, 2] forward costs 1.4 plain ones): some steps run plain though rows have candidates, others
    verify; the tokens, log-probs and top tokens stay those of plain decoding, and every emitted token
    is a row-step's or an accepted candidate."""
    props = {"model_id": str(tiny_dir), "rolling_batch": "scheduler", "dtype": "fp32", "cpu_threads": "fixed"}
    plain_engine = HFEngine.from_config(ServingConfig.from_properties(props))
    engine = HFEngine.from_config(ServingConfig.from_properties({**props, "speculative_config": NGRAM}))
    assert engine.speculator is not None
    engine.speculator.cost = StepCost(8.0)
    tok = engine.tokenizer
    news, joins = [16, 12, 14, 18, 15], [0, 0, 1, 1, 2]
    got = run(engine, requests(tok, news, details=True), joins)
    compare(got, run(plain_engine, requests(tok, news, details=True), joins))
    stats = engine.spec_decode_stats()
    assert stats["spec_decode_num_declined_steps"] > 0 and stats["spec_decode_num_drafts"] > 0
    assert 0 <= stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    emitted = sum(len(outs) for outs in got.values())
    assert emitted == len(news) + stats["spec_decode_num_row_steps"] + stats["spec_decode_num_accepted_tokens"]


def test_a_rows_speculation_state_dies_with_the_row(tiny_model: Any) -> None:
    """The per-row counts live on the row: once it is released and compacted away, nothing holds it."""
    import gc
    import weakref

    model, tok = tiny_model
    engine = speculating(model, tok)
    engine.add_request(EngineRequest(1, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=40)))
    engine.step()
    assert engine._batch is not None
    row = engine._batch.rows[0]
    for _ in range(30):
        engine.step()
        if row.speculation is not None and row.speculation.expected > 0:
            break
    assert row.speculation is not None and row.speculation.expected > 0  # it has verified drafts
    ref = weakref.ref(row)
    del row
    engine.release(1)
    engine.step()
    gc.collect()
    assert ref() is None and not engine.has_unfinished()
    # a new request starts from the engine's rates, not from the old row's counts
    engine.add_request(EngineRequest(2, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=3)))
    engine.step()  # its prefill: the first token goes into its own lookup context
    assert engine._batch is not None
    fresh = engine._batch.rows[0].speculation
    assert fresh is not None and fresh.expected == fresh.accepted == 0.0
    assert len(fresh.history) == len(tok.encode(PROMPTS[0])) + 1
