"""Beam search of one request: its hypotheses, their scores and the rule that ends the search.

The rule is the one of transformers' ``generate(num_beams=..., do_sample=False)`` (its beam search
since the 4.50 rewrite, as in transformers 5), step for step, for one prompt:

- ``num_beams`` running beams; at the first step only beam 0 counts (the others start at -1e9, so
  the beams that fork from one prompt do not pick the same tokens);
- each step the running scores (sums of log-probabilities after the request's processors) are
  extended by every token of every beam and the best ``K = max(2, 1 + len(eos)) * num_beams``
  candidates are kept (``K`` so that at least ``num_beams`` of them do not end);
- a candidate *ends* when its token is an eos or the request has reached its token limit; of the
  candidates that end, those among the first ``num_beams`` enter the finished set scored by
  ``sum / generated ** length_penalty`` (the finished set keeps the best ``num_beams``; once
  ``early_stopping is True`` and it is full, or once no running beam can improve on it, nothing
  enters any more);
- the best ``num_beams`` candidates that do not end are the next running beams (:attr:`parents`
  says which running beam each one continues: the engine copies that beam's KV row);
- the search stops when no running beam can beat the worst finished hypothesis (a bound that
  depends on ``early_stopping``: ``False`` assumes the current length, ``"never"`` with a positive
  ``length_penalty`` the longest allowed), when ``early_stopping is True`` and ``num_beams``
  hypotheses have finished, or when every candidate ended (the token limit).

The finished set, best first, is the answer (:meth:`BeamSearch.best`). :meth:`BeamSearch.settled`
is the part of it already known: the prefix shared by every running beam and every finished
hypothesis, which no later step can change (every later candidate extends a running beam). Streams
send the settled tokens as they grow.

Pure bookkeeping on small CPU tensors (the scores of one request); the forward, the processors and
the KV rows are the engine's (:mod:`djl_handlers.engines.hf.beam_rows`; on vLLM, the one-token
requests of :mod:`djl_handlers.engines.external.vllm_beam_rules`). :func:`beam_outputs` turns a
step into the request's outputs for either.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import torch

from djl_handlers.engines.base import StepOutput

__all__ = ["NEG", "BeamSearch", "Hypothesis", "beam_outputs"]

NEG = -1.0e9  # the score of an empty slot, and the penalty that keeps a candidate out


@dataclass(frozen=True)
class Hypothesis:
    """A finished (or, at the end, returned) sequence: generated tokens, the model's log-prob of
    each (before processors), and its beam score."""

    tokens: tuple[int, ...]
    log_probs: tuple[float, ...]
    score: float


class BeamSearch:
    """The beam state of one request (see the module docstring)."""

    def __init__(
        self,
        num_beams: int,
        limit: int,
        eos_token_ids: Collection[int],
        *,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        ids: Sequence[int] = (),
    ) -> None:
        if num_beams < 1 or limit < 1:
            raise ValueError("num_beams and the token limit must be positive")
        self.num_beams = num_beams
        self.limit = limit  # tokens the request may generate (max_new_tokens within the context)
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.length_penalty = float(length_penalty)
        self.early_stopping = early_stopping
        self.keep = max(2, 1 + len(self.eos)) * num_beams
        self.running: list[tuple[tuple[int, ...], tuple[float, ...]]] = [((), ())] * num_beams
        self.scores = torch.zeros((1, num_beams), dtype=torch.float32)
        self.scores[:, 1:] = NEG
        self.finished: list[tuple[tuple[int, ...], tuple[float, ...]]] = [((), ())] * num_beams
        self.finished_scores = torch.full((1, num_beams), NEG, dtype=torch.float32)
        self.is_finished = torch.zeros((1, num_beams), dtype=torch.bool)
        self.improvable = torch.ones((1, 1), dtype=torch.bool)
        self.parents: list[int] = list(range(num_beams))  # running beam j continues old beam parents[j]
        self.tokens: list[int] = [0] * num_beams  # the token each running beam ends with (to feed next)
        self.done = False
        self.emitted = 0  # settled tokens already reported
        self.prompt_lps: list[float | None] | None = None  # decoder_input_details: sent with the first token
        self.ids = list(ids)  # the engine's ids of the sequences returned (the best first, then the next best)
        self.live = set(self.ids)  # those not released yet

    @property
    def generated(self) -> int:
        """Tokens each running beam holds (the same for all)."""
        return len(self.running[0][0])

    def step(self, log_probs: torch.Tensor, raw_log_probs: torch.Tensor) -> None:
        """Advance by one token. ``log_probs`` [num_beams, vocab] float32: each running beam's next-token
        log-probabilities after the request's processors (what the scores add up); ``raw_log_probs`` the
        same before them (what each token reports). Sets :attr:`parents`, :attr:`tokens`, :attr:`done`."""
        if self.done:
            raise RuntimeError("the beam search has ended")
        vocab = int(log_probs.shape[-1])
        grown = self.generated + 1  # tokens a candidate holds
        totals = (log_probs.float() + self.scores[0, :, None]).reshape(1, -1)
        top_scores, top_index = torch.topk(totals, k=self.keep)
        beams = (top_index // vocab)[0].tolist()
        tokens = (top_index % vocab)[0].tolist()
        raw = raw_log_probs.float()[top_index[0] // vocab, top_index[0] % vocab].tolist()
        candidates = [(self.running[b][0] + (t,), self.running[b][1] + (lp,))
                      for b, t, lp in zip(beams, tokens, raw, strict=True)]
        ends = torch.tensor([[t in self.eos or grown >= self.limit for t in tokens]], dtype=torch.bool)
        self._next_running(top_scores, ends, candidates, beams)
        self._update_finished(top_scores, ends, candidates, grown)
        self._check_end(ends, grown)

    def _next_running(self, top_scores: torch.Tensor, ends: torch.Tensor,
                      candidates: list[tuple[tuple[int, ...], tuple[float, ...]]], beams: list[int]) -> None:
        """The best ``num_beams`` candidates that do not end become the running beams."""
        running_scores = top_scores + ends.to(torch.float32) * NEG
        pick = torch.topk(running_scores, k=self.num_beams)[1]
        chosen = pick[0].tolist()
        self.running = [candidates[c] for c in chosen]
        self.scores = torch.take_along_dim(running_scores, pick, dim=1)
        self.parents = [beams[c] for c in chosen]
        self.tokens = [candidates[c][0][-1] for c in chosen]

    def _update_finished(self, top_scores: torch.Tensor, ends: torch.Tensor,
                         candidates: list[tuple[tuple[int, ...], tuple[float, ...]]], grown: int) -> None:
        """Candidates among the first ``num_beams`` that end enter the finished set, length-penalised,
        unless it is closed (full with ``early_stopping=True``, or no improvement possible)."""
        first = torch.zeros((self.keep,), dtype=torch.bool)
        first[: self.num_beams] = True
        entered = ends & first[None, :]
        scores = top_scores / (grown**self.length_penalty)
        full = torch.all(self.is_finished, dim=-1, keepdim=True) & (self.early_stopping is True)
        scores += full.to(torch.float32) * NEG
        scores += (~self.improvable).to(torch.float32) * NEG
        scores += (~entered) * NEG
        merged = torch.cat((self.finished_scores, scores), dim=1)
        pick = torch.topk(merged, k=self.num_beams)[1]
        pool = self.finished + candidates
        self.finished = [pool[i] for i in pick[0].tolist()]
        self.finished_scores = torch.take_along_dim(merged, pick, dim=1)
        self.is_finished = torch.take_along_dim(torch.cat((self.is_finished, entered), dim=1), pick, dim=1)

    def _check_end(self, ends: torch.Tensor, grown: int) -> None:
        """Whether a running beam can still beat the finished set, and so whether the search goes on."""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.limit
        else:
            best_length = grown
        best_possible = self.scores[:, :1] / (best_length**self.length_penalty)
        worst = torch.where(self.is_finished, torch.min(self.finished_scores, dim=1, keepdim=True)[0], NEG)
        self.improvable = self.improvable & torch.any(best_possible > worst, dim=-1, keepdim=True)
        open_beams = not (bool(torch.all(self.is_finished)) and self.early_stopping is True)
        self.done = not (bool(torch.any(self.improvable)) and open_beams and not bool(torch.all(ends)))

    def settled(self) -> tuple[int, ...]:
        """The generated tokens every possible answer starts with (see the module docstring), up to
        the first eos (an answer's last token, reported only when the search ends)."""
        seqs = [tokens for tokens, _ in self.running]
        seqs += [tokens for (tokens, _), done in zip(self.finished, self.is_finished[0].tolist(), strict=True) if done]
        first = seqs[0]
        size = min(len(s) for s in seqs)
        for i in range(size):
            if first[i] in self.eos or any(s[i] != first[i] for s in seqs):
                return first[:i]
        return first[:size]

    def best(self, count: int = 1) -> list[Hypothesis]:
        """The ``count`` best finished hypotheses, best first (once :attr:`done`); a slot of the
        finished set that never filled gives the best running beam instead."""
        result = []
        flags = self.is_finished[0].tolist()
        scores = self.finished_scores[0].tolist()
        for i in range(min(count, self.num_beams)):
            tokens, lps = self.finished[i] if flags[i] else self.running[i]
            result.append(Hypothesis(tokens, lps, scores[i] if flags[i] else float(self.scores[0, i])))
        return result


def beam_outputs(search: BeamSearch) -> list[StepOutput]:
    """The request's outputs of the step just taken, under each of its ids still live: newly settled
    tokens (shared by every hypothesis), or (search over) the rest of the i-th best hypothesis under
    ``ids[i]``, its last token with ``finish_reason`` (``eos_token`` when it is an eos, else
    ``length``). The first token carries :attr:`BeamSearch.prompt_lps`."""
    settled = search.settled()
    if search.done:
        ends = [(h.tokens, h.log_probs) for h in search.best(len(search.ids))]
    else:
        ends = [(settled, search.running[0][1])] * len(search.ids)
    outputs = []
    for rid, (tokens, lps) in zip(search.ids, ends, strict=True):
        if rid not in search.live:
            continue
        mine = [StepOutput(rid, token_id=tokens[j], log_prob=lps[j],
                           prompt_logprobs=search.prompt_lps if j == 0 else None)
                for j in range(search.emitted, len(tokens))]
        if search.done and mine:
            reason = "eos_token" if mine[-1].token_id in search.eos else "length"
            mine[-1] = replace(mine[-1], finish_reason=reason)
        outputs += mine
    search.emitted = len(settled)
    return outputs
