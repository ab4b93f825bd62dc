"""The HF sampler's vLLM sampling set (min_p, presence/frequency penalties, bad words, min_length)
against a straightforward per-row reference, in mixed batches (no model needed)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.hf.penalties import GeneratePenalties, bad_word_ids  # noqa: E402
from djl_handlers.engines.hf.sampling import RowSampling, processed_logits, sample_batch  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402
from djl_handlers.params.translate import to_hf  # noqa: E402

VOCAB = 50
EOS = 2


class WordTokenizer:
    """A real-enough tokenizer for bad words: each space-separated word is one token per
    character (``a`` = 10, ``b`` = 11, ...); a leading space is token 3."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [3] if text.startswith(" ") else []
        return ids + [10 + ord(c) - ord("a") for c in text.strip()]


def params(**values: Any) -> GenerationParameters:
    return GenerationParameters.from_dict(values)


def row(p: GenerationParameters) -> RowSampling:
    return RowSampling.from_params(p, [5, 6, 7], VOCAB, (EOS,), WordTokenizer())


def logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def reference(x: torch.Tensor, p: GenerationParameters, generated: list[int]) -> torch.Tensor:
    """One row, element by element as vLLM defines each processor (before temperature)."""
    out = x.clone().tolist()
    counts = {t: generated.count(t) for t in set(generated)}
    for token, count in counts.items():
        out[token] -= p.frequency_penalty * count + p.presence_penalty
    for word in bad_word_ids(p.bad_sequences, WordTokenizer()):
        prefix = list(word[:-1])
        if not prefix or generated[len(generated) - len(prefix):] == prefix and len(generated) >= len(prefix):
            out[word[-1]] = float("-inf")
    if len(generated) < max(p.min_new_tokens, p.min_length if "min_length" in p.provided else 0):
        out[EOS] = float("-inf")
    return torch.tensor(out)


def reference_min_p(x: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(x, -1)
    return torch.where(probs < probs.max() * min_p, torch.full_like(x, float("-inf")), x)


ASKS = [
    {},
    {"presence_penalty": 1.5},
    {"frequency_penalty": 0.7, "presence_penalty": -0.5},
    {"bad_sequences": ["c", "ab", " de"]},
    {"min_length": 4},
    {"frequency_penalty": 2.0, "bad_sequences": ["bc"], "min_new_tokens": 2},
]


def test_bad_words_tokenize_as_vllm_does() -> None:
    # "ab" plain is (10, 11); " ab" is (3, 10, 11): a different length, so not added
    assert bad_word_ids(["ab"], WordTokenizer()) == ((10, 11),)
    assert bad_word_ids([" c"], WordTokenizer()) == ((12,),)


def test_each_processor_matches_the_per_row_reference_in_a_mixed_batch() -> None:
    ps = [params(**ask) for ask in ASKS]
    rows = [row(p) for p in ps]
    history: list[list[int]] = [[] for _ in rows]
    forced = [10, 11, 12, 10, 11, 3, 13, 14]  # generated tokens: every row sees the same history
    for step, token in enumerate(forced):
        x = logits(len(rows), seed=step)
        for i, (r, p) in enumerate(zip(rows, ps, strict=True)):
            got = processed_logits(x[i], r)
            torch.testing.assert_close(got, reference(x[i], p, history[i]), rtol=0, atol=1e-5,
                                       msg=f"{ASKS[i]} at step {step}")
        for r, h in zip(rows, history, strict=True):
            r.observe(token)
            h.append(token)


def test_a_mixed_batch_picks_what_each_row_picks_alone_and_plain_greedy_rows_are_untouched() -> None:
    asks = [*ASKS, {"do_sample": True, "seed": 3, "min_p": 0.2}, {"do_sample": True, "seed": 4, "min_p": 0.05,
                                                                  "presence_penalty": 1.0, "top_k": 9}]
    batch = [row(params(**a)) for a in asks]
    alone = [row(params(**a)) for a in asks]
    plain = [row(params()) for _ in asks]
    for step in range(12):
        x = logits(len(asks), seed=100 + step)
        mixed = sample_batch(x, batch)
        singles = [sample_batch(x[i : i + 1], [alone[i]]).tokens[0] for i in range(len(asks))]
        assert mixed.tokens == singles
        greedy = sample_batch(x, plain)
        assert greedy.tokens[0] == mixed.tokens[0] == int(x[0].argmax())  # the row that asks for nothing
        assert mixed.log_probs[0] == greedy.log_probs[0]  # bit-identical
        # log-probs are the model's: raw log_softmax of the chosen token, whatever the processors did
        raw = torch.log_softmax(x.float(), -1)
        for i, tok in enumerate(mixed.tokens):
            assert mixed.log_probs[i] == pytest.approx(float(raw[i, tok]), abs=1e-5)


def test_min_p_keeps_only_tokens_above_its_share_of_the_top_probability() -> None:
    x = logits(1, seed=9)[0]
    r = row(params(do_sample=True, seed=1, min_p=0.3))
    got = processed_logits(x, r)
    assert torch.equal(got == float("-inf"), reference_min_p(x, 0.3) == float("-inf"))
    allowed = set(torch.nonzero(reference_min_p(x, 0.3) > float("-inf")).flatten().tolist())
    picks = {sample_batch(x.unsqueeze(0), [r]).tokens[0] for _ in range(30)}
    assert picks <= allowed


def test_a_single_token_bad_word_is_never_chosen_even_when_it_is_the_argmax() -> None:
    x = torch.zeros(1, VOCAB)
    x[0, 12] = 10.0  # "c" is by far the most likely
    r = row(params(bad_sequences=["c"]))
    for _ in range(3):
        assert sample_batch(x, [r]).tokens[0] != 12


def test_min_length_counts_generated_tokens_and_its_default_asks_for_nothing() -> None:
    assert to_hf(params(min_length=3))["min_new_tokens"] == 3
    assert "min_new_tokens" not in to_hf(params())  # the seed's default 1 is TensorRT-LLM's
    x = torch.zeros(1, VOCAB)
    x[0, EOS] = 10.0
    r = row(params(min_length=2))
    assert [sample_batch(x, [r]).tokens[0] for _ in range(3)][:2] != [EOS, EOS]
    assert sample_batch(x, [r]).tokens[0] == EOS  # after two tokens eos may end it


def test_generate_processor_applies_the_same_penalties_as_the_sampler() -> None:
    p = params(frequency_penalty=0.5, presence_penalty=0.25, bad_sequences=["ab"])
    proc = GeneratePenalties(to_hf(p), 2, VOCAB, WordTokenizer())
    rows = [row(p), row(p)]
    ids = torch.tensor([[5, 6, 7], [5, 6, 7]])
    for step, token in enumerate([10, 10, 11]):
        x = logits(2, seed=step)
        got = proc(ids, x)
        for i in range(2):
            assert torch.equal(got[i], processed_logits(x[i], rows[i]))
        ids = torch.cat([ids, torch.tensor([[token], [token]])], dim=1)
        for r in rows:
            r.observe(token)
