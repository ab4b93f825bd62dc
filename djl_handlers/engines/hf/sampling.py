"""Per-row token selection for a batch of next-token logits.

Every row (request) has its own settings and its own ``torch.Generator`` seeded from
``params.seed``, so a seeded request samples the same tokens alone or next to any neighbours:
each step draws exactly one uniform number from the row's own generator and picks the token by
inverse-CDF lookup in the row's processed distribution.

Processing follows ``transformers``' order for ``generate()`` with vLLM's extras where vLLM puts
them: repetition penalty (also in greedy mode, over prompt and generated tokens), bad words, eos
suppression while ``min_new_tokens`` is not reached, frequency/presence penalties (over generated
tokens) — all in :mod:`.penalties` — then, only when sampling, temperature, min-p (vLLM: after
temperature, before top-k/top-p), top-k, top-p and typical-p. A greedy row that asks for none of
these is the argmax of the raw logits, untouched.

Reported ``log_prob``: the log-probability of the chosen token under the **model's own
distribution**, ``log_softmax(raw logits)``, before any penalty, temperature or truncation. It is
the same quantity in greedy and sampling mode and in the static ``generate()`` path, it is
always finite and ≤ 0 for a token the model can emit, and it is what vLLM reports by default.

This module imports torch; only the HF engine imports it.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from djl_handlers.engines.hf.penalties import PenaltyState, apply_penalties, bad_word_ids
from djl_handlers.kernels.row_stats import row_stats
from djl_handlers.params.translate import to_hf

if TYPE_CHECKING:
    from djl_handlers.params.generation import GenerationParameters

_NEG_INF = float("-inf")


@dataclass
class RowSampling:
    """Sampling settings, RNG and token history of one request."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()
    generator: torch.Generator | None = None
    seen: torch.Tensor | None = None  # bool [vocab]: tokens seen so far (repetition penalty only)
    generated: int = 0
    penalties: PenaltyState | None = None  # frequency/presence penalties, bad words (penalties.py)
    tokenizer: Any = field(default=None, repr=False)  # tokenizes bad words (its samples' rows reuse it)

    @classmethod
    def from_params(
        cls,
        params: GenerationParameters,
        prompt_ids: Sequence[int],
        vocab_size: int,
        eos_token_ids: Collection[int] = (),
        tokenizer: Any = None,
    ) -> RowSampling:
        """Build a row's sampler from a request's parameters, through ``to_hf`` (the one rule)."""
        return cls.from_settings(to_hf(params), params.seed, prompt_ids, vocab_size, eos_token_ids, tokenizer)

    @classmethod
    def from_settings(
        cls,
        settings: Mapping[str, Any],
        seed: int | None,
        prompt_ids: Sequence[int],
        vocab_size: int,
        eos_token_ids: Collection[int] = (),
        tokenizer: Any = None,
    ) -> RowSampling:
        """Build a row's sampler from ``to_hf``/``to_deepspeed`` keyword arguments.

        Greedy requests carry no sampling knobs (``to_hf`` omits them), so their defaults apply;
        ``seed`` seeds the row's generator when sampling (None: a random seed). ``tokenizer``
        tokenizes the ``bad_words`` (required when there are any).
        """
        do_sample = bool(settings["do_sample"])
        row = cls(
            do_sample=do_sample,
            temperature=float(settings.get("temperature", 1.0)),
            top_k=int(settings.get("top_k", 0)),
            top_p=float(settings.get("top_p", 1.0)),
            typical_p=float(settings.get("typical_p", 1.0)),
            min_p=float(settings.get("min_p", 0.0)),
            repetition_penalty=float(settings.get("repetition_penalty", 1.0)),
            min_new_tokens=int(settings.get("min_new_tokens", 0)),
            eos_token_ids=tuple(eos_token_ids),
        )
        if row.top_k >= vocab_size:
            row.top_k = 0
        if do_sample:
            row.generator = torch.Generator(device="cpu")
            row.generator.manual_seed(int(seed) if seed is not None else secrets.randbits(63))
        if row.repetition_penalty != 1.0:
            row.seen = torch.zeros(vocab_size, dtype=torch.bool)
            ids = [i for i in prompt_ids if 0 <= i < vocab_size]
            if ids:
                row.seen[torch.tensor(ids, dtype=torch.long)] = True
        row.penalties = _penalties(settings, vocab_size, tokenizer)
        row.tokenizer = tokenizer
        return row

    @property
    def needs_processing(self) -> bool:
        """True when greedy argmax of the raw logits is not enough for this row."""
        return (self.do_sample or self.seen is not None or self.generated < self.min_new_tokens
                or self.penalties is not None)

    def observe(self, token_id: int) -> None:
        """Record a chosen token (for the penalties, bad words and min_new_tokens)."""
        self.generated += 1
        if self.seen is not None and 0 <= token_id < self.seen.numel():
            self.seen[token_id] = True
        if self.penalties is not None:
            self.penalties.observe(token_id)


def _penalties(settings: Mapping[str, Any], vocab_size: int, tokenizer: Any) -> PenaltyState | None:
    """The row's frequency/presence penalties and bad words (None when it has none)."""
    words = tuple(settings.get("bad_words", ()))
    if words and tokenizer is None:
        raise ValueError("bad_words need the tokenizer")
    state = PenaltyState(
        vocab_size,
        presence=float(settings.get("presence_penalty", 0.0)),
        frequency=float(settings.get("frequency_penalty", 0.0)),
        bad_words=bad_word_ids(words, tokenizer) if words else (),
    )
    return state if state.active else None


@dataclass
class SampleResult:
    """Chosen tokens, their log-probs (model distribution) and per-row errors (None = ok).

    ``top_tokens`` (only when ``sample_batch`` got ``top_n``): per row, the ``top_n[i]`` most
    likely ``(token_id, log_prob)`` of the same distribution, or None for rows that asked for none.
    """

    tokens: list[int]
    log_probs: list[float]
    errors: list[str | None] = field(default_factory=list)
    top_tokens: list[list[tuple[int, float]] | None] | None = None


def sample_batch(
    logits: torch.Tensor, rows: Sequence[RowSampling], top_n: Sequence[int] | None = None
) -> SampleResult:
    """Pick one token per row of ``logits`` ([batch, vocab]) according to ``rows``.

    A failure confined to one row (non-finite logits, an error in its processing) gives that row
    an error message and token -1; the other rows are unaffected. ``observe`` is called for every
    row that got a token. ``top_n`` (one count per row, 0 = none) also returns each asking row's
    most likely tokens with log-probs from the same ``log_softmax`` as ``log_probs``.
    """
    special = [i for i, row in enumerate(rows) if row.needs_processing]
    stats = row_stats(logits) if logits.is_cpu else None  # argmax and log_z in one C pass (None: torch's)
    if stats is not None and not special and not (top_n is not None and any(top_n)):
        return _greedy(logits, rows, *stats)  # the common case: the fp32 copy is not even made
    logits = logits.float()
    tokens = logits.argmax(dim=-1) if stats is None else stats[0]
    errors: list[str | None] = [None] * len(rows)
    if special:
        idx = torch.tensor(special, dtype=torch.long, device=logits.device)
        try:
            chosen = _select(logits[idx], [rows[i] for i in special], checked=stats is not None)
            tokens[idx] = chosen.to(tokens.device)
        except (RuntimeError, ValueError):
            for i in special:  # isolate the failing row(s)
                try:
                    tokens[i] = _select(logits[i : i + 1], [rows[i]])[0]
                except (RuntimeError, ValueError) as exc:
                    errors[i] = f"sampling failed: {exc}"
    log_z = torch.logsumexp(logits, dim=-1) if stats is None else stats[1]
    picked = logits.gather(1, tokens.clamp(min=0).unsqueeze(1)).squeeze(1)
    log_probs = (picked - log_z).tolist()
    token_list = tokens.tolist()
    for i, lp in enumerate(log_probs):
        if errors[i] is None and (math.isnan(lp) or lp > 0.0):  # NaN/+inf logits: garbage out
            errors[i] = "the model produced non-finite logits for this request"
        if errors[i] is not None:
            token_list[i], log_probs[i] = -1, float("nan")
        else:
            rows[i].observe(token_list[i])
    result = SampleResult(token_list, log_probs, errors)
    if top_n is not None:
        result.top_tokens = top_log_probs(logits, log_z, top_n)
    return result


def log_normalizer(logits: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` of each row of ``logits`` [rows, vocab] as float32 — the same quantity
    :func:`sample_batch` subtracts, from the same kernel where it applies."""
    stats = row_stats(logits) if logits.is_cpu else None
    return torch.logsumexp(logits.float(), dim=-1) if stats is None else stats[1]


def _greedy(
    logits: torch.Tensor, rows: Sequence[RowSampling], tokens: torch.Tensor, log_z: torch.Tensor
) -> SampleResult:
    """Every row greedy on the raw logits, all finite: the argmax and its log-prob."""
    picked = logits.gather(1, tokens.unsqueeze(1)).squeeze(1).float()
    token_list = tokens.tolist()
    for row, token in zip(rows, token_list, strict=True):
        row.observe(token)
    return SampleResult(token_list, (picked - log_z).tolist(), [None] * len(rows))


def top_log_probs(
    logits: torch.Tensor, log_z: torch.Tensor, top_n: Sequence[int]
) -> list[list[tuple[int, float]] | None]:
    """Per row, the ``top_n[i]`` largest ``(token_id, logit - log_z)`` (None where ``top_n[i]`` is 0).

    Only rows that ask are computed (one ``topk`` over those rows).
    """
    result: list[list[tuple[int, float]] | None] = [None] * len(top_n)
    asking = [i for i, n in enumerate(top_n) if n > 0]
    if not asking:
        return result
    idx = torch.tensor(asking, dtype=torch.long, device=logits.device)
    k = min(max(top_n[i] for i in asking), logits.shape[-1])
    values, ids = torch.topk(logits[idx], k, dim=-1)
    lps = (values - log_z[idx].unsqueeze(1)).tolist()
    for j, i in enumerate(asking):
        n = top_n[i]
        result[i] = list(zip(ids[j, :n].tolist(), lps[j][:n], strict=True))
    return result


def _select(logits: torch.Tensor, rows: Sequence[RowSampling], checked: bool = False) -> torch.Tensor:
    """Processed selection for rows that need more than argmax. ``logits`` [n, vocab] float32;
    ``checked``: the rows are known to hold no NaN (the row-stats kernel accepted them)."""
    if not checked and torch.isnan(logits).any():
        raise ValueError("the model produced NaN logits")
    x = apply_penalties(logits.clone(), rows)
    sampled = [i for i, row in enumerate(rows) if row.do_sample]
    if not sampled:
        return x.argmax(dim=-1)
    chosen = torch.zeros(len(rows), dtype=torch.long, device=x.device)
    greedy = [i for i, row in enumerate(rows) if not row.do_sample]
    if greedy:  # the argmax only where it is the answer
        at = torch.tensor(greedy, dtype=torch.long, device=x.device)
        chosen[at] = x[at].argmax(dim=-1)
    idx = torch.tensor(sampled, dtype=torch.long, device=x.device)
    chosen[idx] = _sample(x[idx], [rows[i] for i in sampled])
    return chosen


def processed_logits(logits: torch.Tensor, row: RowSampling) -> torch.Tensor:
    """One row's logits ([vocab] float32) after the processing :func:`sample_batch` applies for it
    (penalties, bad words, eos suppression, and when sampling temperature, min-p, top-k, top-p,
    typical-p), before the
    softmax: speculative verification (``engines/hf/speculative.py``) reads the same distribution."""
    x = apply_penalties(logits.unsqueeze(0).clone(), [row])
    if row.do_sample:
        x = x / row.temperature
        if row.min_p > 0.0:
            x = _min_p(x, torch.tensor([row.min_p], dtype=x.dtype, device=x.device))
        if row.top_k > 0:
            x = _top_k(x, [row.top_k])
        if row.top_p < 1.0:
            x = _top_p(x, torch.tensor([row.top_p], dtype=x.dtype, device=x.device))
        if row.typical_p < 1.0:
            x = _typical_p(x, torch.tensor([row.typical_p], dtype=x.dtype, device=x.device))
    return x[0]


def _sample(x: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """Temperature, min-p, top-k, top-p, typical-p, then one draw per row from its own generator."""
    dev = x.device
    temps = torch.tensor([r.temperature for r in rows], dtype=x.dtype, device=dev).unsqueeze(1)
    x = x / temps
    if any(r.min_p > 0.0 for r in rows):
        x = _min_p(x, torch.tensor([r.min_p for r in rows], dtype=x.dtype, device=dev))
    if any(r.top_k > 0 for r in rows):
        x = _top_k(x, [r.top_k for r in rows])
    if any(r.top_p < 1.0 for r in rows):
        x = _top_p(x, torch.tensor([r.top_p for r in rows], dtype=x.dtype, device=dev))
    if any(r.typical_p < 1.0 for r in rows):
        x = _typical_p(x, torch.tensor([r.typical_p for r in rows], dtype=x.dtype, device=dev))
    probs = torch.softmax(x, dim=-1)
    if torch.isnan(probs).any():
        raise ValueError("the processed distribution is not a probability distribution")
    draws = [torch.rand(1, generator=r.generator).item() for r in rows]
    u = torch.tensor(draws, dtype=probs.dtype, device=dev).unsqueeze(1)
    cdf = probs.cumsum(dim=-1)
    target = u * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return picked.clamp(max=x.shape[-1] - 1)


def _min_p(x: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """vLLM's min-p: drop tokens whose probability is below ``min_p`` times the row's largest
    (per-row ``min_p``; 0 keeps every token)."""
    probs = torch.softmax(x, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return x.masked_fill(probs < threshold, _NEG_INF)


def _top_k(x: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Keep each row's ``k`` largest logits (k = 0: keep all)."""
    kmax = max(ks)
    top = torch.topk(x, kmax, dim=-1).values
    k = torch.tensor(ks, dtype=torch.long, device=x.device)
    threshold = top.gather(1, (k.clamp(min=1) - 1).unsqueeze(1))
    threshold = torch.where(k.unsqueeze(1) > 0, threshold, torch.full_like(threshold, _NEG_INF))
    return x.masked_fill(x < threshold, _NEG_INF)


def _top_p(x: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filtering as HF does it (ascending sort, drop mass ≤ 1 - p, keep ≥ 1 token)."""
    sorted_logits, sorted_idx = torch.sort(x, descending=False, dim=-1)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p).unsqueeze(1)
    remove[:, -1] = False
    remove = remove & (top_p < 1.0).unsqueeze(1)
    mask = remove.scatter(1, sorted_idx, remove)
    return x.masked_fill(mask, _NEG_INF)


def _typical_p(x: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical filtering as HF's ``TypicalLogitsWarper`` (per-row mass)."""
    normalized = torch.log_softmax(x, dim=-1)
    p = normalized.exp()
    ent = -(p * normalized).nansum(-1, keepdim=True)
    shifted = (-normalized - ent).abs()
    sorted_scores, sorted_idx = torch.sort(shifted, descending=False)
    sorted_logits = x.gather(-1, sorted_idx)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    last_ind = (cumulative < mass.unsqueeze(1)).sum(dim=1).clamp(max=x.shape[-1] - 1)
    remove = sorted_scores > sorted_scores.gather(1, last_ind.unsqueeze(1))
    remove[:, 0] = False
    remove = remove & (mass < 1.0).unsqueeze(1)
    mask = remove.scatter(1, sorted_idx, remove)
    return x.masked_fill(mask, _NEG_INF)
