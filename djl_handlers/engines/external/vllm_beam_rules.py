"""The two beam-search rules our own loop over vLLM runs (:mod:`vllm_beam_loop`), as state machines.

The loop asks vLLM, each step, for one token per live beam (a request whose prompt is the request's
prompt and the beam's tokens, ``max_tokens=1``, greedy, ``logprobs`` = :attr:`BeamRule.logprobs`) and
feeds each beam's returned top log-probabilities (``{token id: log-prob}``, in vLLM's order) back:

- :meth:`BeamRule.asks`: the generated tokens of each beam to extend this step (one vLLM request each);
- :meth:`BeamRule.feed`: the beams' top log-probs, in the order of ``asks``; returns the request's
  outputs of the step (none until something is known) and sets :attr:`BeamRule.done`;
- :attr:`BeamRule.live`: the request's ids (its own, then its sample ids) not released yet.

:class:`~djl_handlers.engines.external.vllm_beam_transformers.TransformersRule` is transformers'
``generate(num_beams=...)`` rule (in its own module, as it steps torch tensors).

:class:`VllmRule` is the rule of vLLM's own loop (``BeamSearchOnlineMixin.beam_search``, vLLM 0.32),
re-implemented so that the synchronous engine answers what vLLM's loop answers on the asynchronous
one: one beam at first, ``logprobs = 2 x beam_width``; every returned eos (the tokenizer's
``eos_token_id``, unless ``ignore_eos``) ends a hypothesis at once, whatever its rank; the other
candidates, ranked by cumulative log-prob (numpy's ``argpartition``/``argsort``, as vLLM, so ties fall
alike), give the next ``beam_width`` beams; ``max_tokens`` steps at most; at the end the finished and
running beams, sorted by ``cumulative log-prob / length ** length_penalty`` with the prompt counted in
the length and a final eos not, give the ``beam_width`` best. It reports once, at the end, each
sequence as vLLM's ``CompletionOutput`` shows it, through :func:`sequence_outputs` (what the
asynchronous adapter does with vLLM's own answer).

Pure bookkeeping: no vLLM or torch import (numpy, which vLLM requires, only in :meth:`VllmRule.feed`),
so importing the adapter pulls neither.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from djl_handlers.engines.base import StepOutput
from djl_handlers.engines.external.vllm_outputs import map_finish_reason

__all__ = ["BeamRule", "Ended", "Tops", "VllmRule", "error_outputs", "sequence_outputs"]

Tops = Mapping[int, float]  # one beam's next-token log-probs as vLLM returned them: its top K, by token id


class BeamRule(Protocol):
    """What the loops drive (see the module docstring)."""

    live: set[int]
    logprobs: int  # the log-probs asked of vLLM per beam and step

    @property
    def done(self) -> bool: ...

    def asks(self) -> list[tuple[int, ...]]: ...

    def feed(self, tops: Sequence[Tops]) -> list[StepOutput]: ...


@dataclass(frozen=True)
class Ended:
    """A sequence returned by :class:`VllmRule`, shaped as vLLM's ``CompletionOutput``: its tokens (no
    final eos unless ``include_stop_str_in_output``), each step's top log-probs (the eos step included),
    ``finish_reason`` ``stop`` (``stop_reason`` the eos) or ``length``."""

    token_ids: tuple[int, ...]
    logprobs: tuple[Tops, ...]
    finish_reason: str
    stop_reason: Optional[int] = None


@dataclass
class _Beam:
    tokens: tuple[int, ...]  # generated
    logprobs: tuple[Tops, ...] = ()
    cum: float = 0
    finish_reason: Optional[str] = None
    stop_reason: Optional[int] = None


@dataclass
class VllmRule:
    """vLLM's own rule (module docstring) for one request; ``ids``: its id, then its sample ids."""

    prompt: Sequence[int]
    beam_width: int
    max_tokens: int
    eos_token_id: Optional[int]
    ids: Sequence[int]
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    length_penalty: float = 1.0
    done: bool = False
    live: set[int] = field(default_factory=set)
    running: list[_Beam] = field(default_factory=lambda: [_Beam(())])
    completed: list[_Beam] = field(default_factory=list)
    steps: int = 0
    logprobs: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.live = set(self.ids)
        self.logprobs = 2 * self.beam_width
        if self.max_tokens < 1:
            self.done = True

    def asks(self) -> list[tuple[int, ...]]:
        return [beam.tokens for beam in self.running]

    def feed(self, tops: Sequence[Tops]) -> list[StepOutput]:
        """One step: eos candidates finish, the best ``beam_width`` others run on; at the end, the answer."""
        import numpy as np

        candidates: list[tuple[float, int, _Beam, Tops]] = []
        for beam, top in zip(self.running, tops, strict=True):
            for token, logprob in top.items():
                cum = beam.cum + logprob
                if token == self.eos_token_id and not self.ignore_eos:
                    kept = beam.tokens + (token,) if self.include_stop_str_in_output else beam.tokens
                    self.completed.append(_Beam(kept, beam.logprobs + (top,), cum, "stop", token))
                else:
                    candidates.append((cum, int(token), beam, top))
        scores = np.fromiter((c[0] for c in candidates), dtype=np.float64, count=len(candidates))
        if len(candidates) <= self.beam_width:
            order = np.argsort(-scores)
        else:
            order = np.argpartition(-scores, self.beam_width - 1)[: self.beam_width]
            order = order[np.argsort(-scores[order])]
        self.running = [_Beam(beam.tokens + (token,), beam.logprobs + (top,), cum)
                        for cum, token, beam, top in (candidates[int(i)] for i in order)]
        self.steps += 1
        if self.running and self.steps < self.max_tokens:
            return []
        self.done = True
        return self._answer()

    def _score(self, beam: _Beam) -> float:
        """vLLM's sort key: the prompt counts in the length, a final eos does not."""
        full = [*self.prompt, *beam.tokens]
        length = len(full) - (1 if full and full[-1] == self.eos_token_id else 0)
        return beam.cum / (max(length, 1) ** self.length_penalty)

    def results(self) -> list[Ended]:
        """The ``beam_width`` best sequences, best first (once :attr:`done`)."""
        best = sorted(self.completed + self.running, key=self._score, reverse=True)[: self.beam_width]
        return [Ended(b.tokens, b.logprobs, b.finish_reason or "length", b.stop_reason) for b in best]

    def _answer(self) -> list[StepOutput]:
        outs: list[StepOutput] = []
        for rid, ended in zip(self.ids, self.results(), strict=False):
            if rid in self.live:
                outs += sequence_outputs(rid, ended)
        return outs


def sequence_outputs(rid: int, comp: Any) -> list[StepOutput]:
    """One returned beam (vLLM's ``CompletionOutput``, or an :class:`Ended`) as token outputs, its finish
    reason on the last (eos: the eos token itself when vLLM left it out of the tokens)."""
    if comp.finish_reason == "error":
        return [StepOutput(rid, error="vLLM's beam search failed")]
    reason = map_finish_reason(comp.finish_reason, comp.stop_reason)
    tokens = list(comp.token_ids)
    steps = list(comp.logprobs or [])
    if reason == "eos_token" and isinstance(comp.stop_reason, int) and (not tokens or tokens[-1] != comp.stop_reason):
        tokens.append(comp.stop_reason)
    outs = []
    for j, token in enumerate(tokens):
        entry = steps[j].get(token) if j < len(steps) else None
        outs.append(StepOutput(rid, token_id=token, log_prob=getattr(entry, "logprob", entry)))
    if not outs:
        return [StepOutput(rid, error="vLLM's beam search returned no tokens")]
    last = outs[-1]
    outs[-1] = StepOutput(rid, token_id=last.token_id, log_prob=last.log_prob, finish_reason=reason or "length")
    return outs


def error_outputs(ids: Collection[int], why: str) -> list[StepOutput]:
    """The request's end on an error of one of its one-token requests, under each live id."""
    return [StepOutput(rid, error=why) for rid in ids]
