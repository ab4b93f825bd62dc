"""Prompt-lookup speculative decoding in the HF engine (``option.speculative_config``, method ``ngram``).

A decode step with speculation: every running row proposes up to ``k`` candidate tokens by prompt
lookup (:mod:`.lookup`, over its own prompt and output). Then the step decides whether verifying pays
(:mod:`.speculation_policy`): it weighs each row's expected accepted candidates (an acceptance rate
per n-gram match length learnt from the drafts verified so far, scaled by the row's own recent record)
against the cost of a wider forward (a fixed cost per forward plus one per token fed), and picks the
verify width ``w`` (at most ``k``) that gives the rows the least mean time per token; ``w = 0``, the
plain decode step, unless a width beats it by a margin. So rows whose text cannot be predicted stop
paying for verification (their candidates still ride along, for free, in a step that verifies for
others), and are probed again once their record has faded. When the step verifies, it cuts every
row's candidates at ``w`` and feeds ``[pending, candidates..., filler]`` for every row in one forward
of ``[B, 1 + K]`` (``K`` the most candidates of any row, at most ``w``; a row with fewer is filled
with copies of its pending token, real columns of the mask so that every row stays "left padding,
then causal": a position never attends to the fillers after it) and reads the logits of every position. Then, per row:

* **rows without candidates** (no match, a grammar, no room left under ``max_new_tokens`` or the
  context length) take their token from the first position exactly as a plain decode step would
  (the engine's ``_emit``: the same sampling, grammar masks and random draws);
* **greedy rows** accept candidates while each equals the argmax at its position and emit the
  first argmax that differs (or the one after the last candidate): the tokens plain greedy decoding
  gives, several per step;
* **rows that sample** (or carry a repetition penalty / ``min_new_tokens``, which depend on the
  tokens before) go position by position through the row's processed distribution ``p``: the
  candidate ``t`` is accepted with probability ``p(t)``; on a rejection the token is drawn from
  ``p`` without ``t``, renormalised, and the row stops there; all accepted: one more token is drawn
  from the last position's ``p``. For a draft that is a point mass (prompt lookup) this is the
  standard speculative-sampling rule, and each emitted token has exactly the distribution plain
  sampling gives it. Rows that sample with the client's own seed verify no candidates: their
  tokens stay those of the same seed without speculation, whatever the batch around them.

Every emitted token's ``log_prob`` (and top tokens) comes from the raw logits at its position, as in
a plain step. KV: the forward wrote ``1 + K`` columns per row; a row keeps ``1 + accepted`` of them.
Rows are realigned to the right (the rows that kept fewer columns move right by the difference,
their KV and mask), the rejected columns are dropped and common left padding is trimmed
(:meth:`~djl_handlers.engines.hf.batch.KVBatch.keep_new`), so the batch keeps the engine's
left-padded layout.

Counters (vLLM's names): ``spec_decode_num_drafts`` (rows that verified at least one candidate),
``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens``; and the decode row-steps, from
which tokens per row and step follow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from djl_handlers.config.speculative import NgramOptions
from djl_handlers.engines.base import StepOutput
from djl_handlers.engines.hf.lookup import lookup
from djl_handlers.engines.hf.lora import use_rows
from djl_handlers.engines.hf.sampling import processed_logits, top_log_probs
from djl_handlers.engines.hf.speculation_policy import (
    AcceptanceRates,
    RowSpeculation,
    StepCost,
    verify_width,
)
from djl_handlers.kernels.row_stats import row_stats

if TYPE_CHECKING:
    from djl_handlers.engines.hf.batch import KVBatch
    from djl_handlers.engines.hf.rows import Row

__all__ = ["Speculator", "accept_or_resample", "draw"]


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from ``probs`` [vocab] by inverse CDF with one uniform draw (the plain step's rule)."""
    u = torch.rand(1, generator=generator, dtype=probs.dtype)
    cdf = probs.cumsum(dim=-1)
    return int(torch.searchsorted(cdf, u * cdf[-1:], right=True).clamp(max=probs.shape[-1] - 1)[0])


def accept_or_resample(probs: torch.Tensor, candidate: int, generator: torch.Generator | None) -> tuple[int, bool]:
    """Speculative sampling for a point-mass draft: ``(candidate, True)`` with probability
    ``probs[candidate]``, else ``(token drawn from probs without the candidate, False)``."""
    u = float(torch.rand(1, generator=generator))
    if u < float(probs[candidate]):
        return candidate, True
    rest = probs.clone()
    rest[candidate] = 0.0
    if float(rest.sum()) <= 0.0:
        return candidate, True
    return draw(rest, generator), False


@dataclass
class _Verdict:
    """What verification gave one row: its tokens, their log-probs and top tokens, or an error."""

    tokens: list[int]
    log_probs: list[float]
    top: list[list[tuple[int, float]]] | None = None
    error: str | None = None


class Speculator:
    """Prompt-lookup speculation for one engine: proposals, when to verify, the verify step, its counters."""

    def __init__(self, options: NgramOptions, cost: StepCost | None = None) -> None:
        self.k = options.num_speculative_tokens
        self.low = options.prompt_lookup_min
        self.high = options.prompt_lookup_max
        self.rates = AcceptanceRates()
        self.cost = cost  # None: the model for the batch's device type, at the first step
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.row_steps = 0
        self.declined_steps = 0

    def stats(self) -> dict[str, Any]:
        """Running totals (vLLM's counter names) plus the acceptance rate, tokens per row-step and the
        steps that had candidates but ran plain (the rule found verifying them not worth its cost)."""
        drafted, accepted = self.num_draft_tokens, self.num_accepted_tokens
        return {"spec_decode_num_drafts": self.num_drafts, "spec_decode_num_draft_tokens": drafted,
                "spec_decode_num_accepted_tokens": accepted, "spec_decode_num_row_steps": self.row_steps,
                "spec_decode_num_declined_steps": self.declined_steps,
                "spec_decode_acceptance_rate": accepted / drafted if drafted else 0.0,
                "spec_decode_tokens_per_step": 1.0 + accepted / self.row_steps if self.row_steps else 0.0}

    def observe(self, rows: Sequence[Row], tokens: Sequence[int]) -> None:
        """Record the tokens a plain step chose (each row's lookup context: prompt and output)."""
        for row, token in zip(rows, tokens, strict=True):
            if token >= 0:
                _state(row).history.append(token)

    def proposals(self, batch: KVBatch, max_model_len: int) -> list[tuple[list[int], int]]:
        """Each row's candidates and the length of the n-gram that found them: none for grammar rows and
        seeded sampling rows, and never past ``max_new_tokens`` (counting the token verification adds) or
        the context length."""
        out: list[tuple[list[int], int]] = []
        for row, pos in zip(batch.rows, batch.pos.tolist(), strict=True):
            room = min(self.k, max_model_len - 2 - int(pos),
                       int(row.request.params.max_new_tokens) - row.sampling.generated - 1)
            if room < 1 or row.grammar is not None or row.done or _seeded_sampling(row):
                out.append(([], 0))
            else:
                out.append(lookup(_state(row).history, room, self.low, self.high))
        return out

    def decode(self, engine: Any, batch: KVBatch) -> list[StepOutput] | None:
        """The decode step with verification, or None for the plain step (the engine runs it): when no
        row has a candidate, or when verifying them is not expected to pay (:func:`verify_width`)."""
        found = self.proposals(batch, engine.max_model_len)
        rows, device = batch.rows, batch.mask.device
        self.row_steps += len(rows)
        self.rates.fade()
        for row in rows:
            _state(row).fade()
        if self.cost is None:
            self.cost = StepCost.for_device(device.type)
        gains = [[self.rates.expected(_state(row), match, n) for n in range(1, len(c) + 1)]
                 for row, (c, match) in zip(rows, found, strict=True)]
        width = verify_width(gains, self.cost)
        if width == 0:
            self.declined_steps += 1 if any(gains) else 0
            return None
        cands = [c[:width] for c, _ in found]
        width = max(len(c) for c in cands)
        pending = batch.pending.tolist()
        feed = [[p, *c, *([p] * (width - len(c)))] for p, c in zip(pending, cands, strict=True)]
        ids = torch.tensor(feed, dtype=torch.long, device=device)
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(rows), 1 + width))], dim=1)
        pos = batch.pos.unsqueeze(1) + torch.arange(1 + width, device=device).unsqueeze(0)
        use_rows(engine.lora, rows)
        logits = engine._forward_tail(ids, batch.mask, pos, batch.cache, 1 + width)  # [B, 1 + K, vocab]
        return self._accept(engine, batch, logits, cands, [match for _, match in found], width)

    def _accept(self, engine: Any, batch: KVBatch, logits: torch.Tensor, cands: list[list[int]],
                matches: list[int], width: int) -> list[StepOutput]:
        rows = batch.rows
        plain = [i for i, c in enumerate(cands) if not c]
        outputs: dict[int, list[StepOutput]] = {}
        tokens = [0] * len(rows)
        kept = [1] * len(rows)
        if plain:
            idx = torch.tensor(plain, dtype=torch.long, device=logits.device)
            for i, out in zip(plain, engine._emit(logits[idx, 0], [rows[i] for i in plain], None), strict=True):
                outputs[i] = [out]
                tokens[i] = max(out.token_id, 0)
        spec = [i for i, c in enumerate(cands) if c]
        sub = logits[torch.tensor(spec, dtype=torch.long, device=logits.device)]
        verdicts = _verify(sub, [rows[i] for i in spec], [cands[i] for i in spec])
        for i, verdict in zip(spec, verdicts, strict=True):
            row, rid = rows[i], rows[i].request.request_id
            self.num_drafts += 1
            self.num_draft_tokens += len(cands[i])
            if verdict.error is not None:
                row.done = True
                engine._ids.discard(rid)
                outputs[i] = [StepOutput(rid, error=verdict.error)]
                continue
            self.num_accepted_tokens += len(verdict.tokens) - 1
            self.rates.record(_state(row), matches[i], len(verdict.tokens) - 1, len(cands[i]))
            kept[i] = len(verdict.tokens)
            tokens[i] = verdict.tokens[-1]
            _state(row).history.extend(verdict.tokens)
            outputs[i] = [StepOutput(rid, token_id=t, log_prob=lp, top_tokens=verdict.top[j] if verdict.top else None)
                          for j, (t, lp) in enumerate(zip(verdict.tokens, verdict.log_probs, strict=True))]
        batch.pos = batch.pos + torch.tensor(kept, dtype=batch.pos.dtype, device=batch.pos.device)
        batch.pending = torch.tensor(tokens, dtype=torch.long, device=batch.pending.device)
        batch.keep_new(kept, 1 + width)
        return [out for i in range(len(rows)) for out in outputs.get(i, [])]


def _verify(logits: torch.Tensor, rows: list[Row], cands: list[list[int]]) -> list[_Verdict]:
    """Accept or reject each row's candidates against its logits ([rows, 1 + K, vocab])."""
    count, steps, vocab = logits.shape
    flat = logits.reshape(-1, vocab)
    stats = row_stats(flat) if flat.is_cpu else None  # argmax and log_z as a plain step computes them
    if stats is None:
        flat = flat.float()
        stats = (flat.argmax(dim=-1), torch.logsumexp(flat, dim=-1))
    argmax = stats[0].reshape(count, steps).tolist()
    log_z = stats[1].reshape(count, steps)
    verdicts = []
    for i, (row, cand) in enumerate(zip(rows, cands, strict=True)):
        if row.sampling.needs_processing:
            picked = _processed_row(logits[i], row, cand)
        else:
            picked = argmax[i][: _agree(argmax[i], cand) + 1]
            for token in picked:
                row.sampling.observe(token)
        if picked is None:
            verdicts.append(_Verdict([], [], error="the model produced NaN logits for this request"))
        else:
            verdicts.append(_scored(logits[i], log_z[i], picked, row.top_n))
    return verdicts


def _agree(argmax: Sequence[int], cand: Sequence[int]) -> int:
    """How many leading candidates equal the argmax at their position."""
    n = 0
    while n < len(cand) and cand[n] == argmax[n]:
        n += 1
    return n


def _processed_row(logits: torch.Tensor, row: Row, cand: Sequence[int]) -> list[int] | None:
    """Position by position through the row's processed distribution (see the module docstring);
    None when a position's logits hold NaN."""
    sampling = row.sampling
    picked: list[int] = []
    for j in range(len(cand) + 1):
        x = processed_logits(logits[j].float(), sampling)
        if bool(torch.isnan(x).any()):
            return None
        if not sampling.do_sample:
            token = int(x.argmax())
            accepted = j < len(cand) and token == cand[j]
        else:
            probs = torch.softmax(x, dim=-1)
            if j < len(cand):
                token, accepted = accept_or_resample(probs, cand[j], sampling.generator)
            else:
                token, accepted = draw(probs, sampling.generator), False
        sampling.observe(token)
        picked.append(token)
        if not accepted:
            break
    return picked


def _scored(logits: torch.Tensor, log_z: torch.Tensor, tokens: list[int], top_n: int) -> _Verdict:
    """The tokens' log-probs under the raw logits at their positions (and top tokens when asked);
    an error when one is not finite, as in a plain step."""
    n = len(tokens)
    want = torch.tensor(tokens, dtype=torch.long, device=logits.device).unsqueeze(1)
    picked = logits[:n].gather(1, want).squeeze(1).float()
    lps = (picked - log_z[:n]).tolist()
    if any(math.isnan(lp) or lp > 0.0 for lp in lps):
        return _Verdict([], [], error="the model produced non-finite logits for this request")
    top = top_log_probs(logits[:n].float(), log_z[:n], [top_n] * n) if top_n else None
    return _Verdict(tokens, lps, [t or [] for t in top] if top is not None else None)


def _seeded_sampling(row: Row) -> bool:
    """A sampling row with the client's own seed: it verifies no candidates, so that its draws are spent as
    in a plain step and its tokens are the same with speculation on or off, beside any neighbours (which
    steps verify depends on the other rows and on the learnt rates)."""
    return bool(row.sampling.do_sample) and row.request.params.seed is not None


def _state(row: Row) -> RowSpeculation:
    """The row's speculation state; its lookup context (prompt and every token chosen so far) is built
    at first use."""
    if row.speculation is None:
        row.speculation = RowSpeculation(list(row.request.prompt_ids))
    return row.speculation
