"""The fake TensorRT-LLM's beam search over the toy model (test-only, not part of the real package).

The real runtime searches ``best_of`` beams (``SamplingParams.use_beam_search``) in its C++ kernels;
this is a plain beam search with the same knobs over the toy model's distribution
(``fake_toy_model.beam_candidates``): every step each running beam is extended by its candidates,
those ending with ``end_id`` (unless ``ignore_eos``, and past ``min_tokens``) finish with the score
``cumulative log-prob / length ** length_penalty`` (the end token counted), and the ``best_of`` best
of the others by cumulative log-prob run on. ``early_stopping``: 1 (the runtime's default) ends once
``best_of`` hypotheses finished; 0 ends once no running beam can beat the worst of them at its
current length; other values run to ``max_tokens``. At the end the running beams join the finished
ones (finished by length) and the best ``best_of``, best first, are the request's sequences. The end
token is not part of a sequence's ``token_ids`` (as elsewhere in the fake).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from tensorrt_llm._toy import beam_candidates, token_logprob


@dataclass
class Hypothesis:
    tokens: list[int]
    cum: float  # cumulative log-prob (of the tokens, and of the end token once it ended with one)
    finish: Optional[str] = None  # "end_id" | "length"
    score: float = 0.0


@dataclass
class BeamSearch:
    """One beam request's search state (``params``: its ``SamplingParams``)."""

    params: Any
    last: int
    running: list[Hypothesis] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)
    done: bool = False

    def __post_init__(self) -> None:
        self.width = int(self.params.best_of or self.params.n)
        self.penalty = float(self.params.length_penalty if self.params.length_penalty is not None else 0.0)
        self.early = int(self.params.early_stopping if self.params.early_stopping is not None else 1)
        self.running = [Hypothesis([], 0.0)]

    def _score(self, cum: float, length: int) -> float:
        return cum / (max(length, 1) ** self.penalty)

    def step(self) -> None:
        """One token for every running beam."""
        params = self.params
        grown: list[Hypothesis] = []
        for beam in self.running:
            last = beam.tokens[-1] if beam.tokens else self.last
            for tok, lp in beam_candidates(last):
                past_min = len(beam.tokens) + 1 >= (params.min_tokens or 1)
                if tok == params.end_id and not params.ignore_eos and past_min:
                    ended = Hypothesis(list(beam.tokens), beam.cum + lp, "end_id")
                    ended.score = self._score(ended.cum, len(beam.tokens) + 1)
                    self.finished.append(ended)
                elif tok != params.end_id or params.ignore_eos:
                    grown.append(Hypothesis([*beam.tokens, tok], beam.cum + lp))
        self.finished = sorted(self.finished, key=lambda h: h.score, reverse=True)[: self.width]
        self.running = sorted(grown, key=lambda h: h.cum, reverse=True)[: self.width]
        at_limit = not self.running or len(self.running[0].tokens) >= params.max_tokens
        full = len(self.finished) >= self.width
        if self.early == 1:
            hopeless = full
        elif self.early == 0:
            best = self._score(self.running[0].cum, len(self.running[0].tokens)) if self.running else float("-inf")
            hopeless = full and best <= self.finished[-1].score
        else:
            hopeless = False
        self.done = at_limit or hopeless

    def best(self) -> list[Hypothesis]:
        """The ``best_of`` best hypotheses, best first (running beams count as finished by length)."""
        pool = list(self.finished)
        for beam in self.running:
            pool.append(Hypothesis(beam.tokens, beam.cum, "length", self._score(beam.cum, len(beam.tokens))))
        return sorted(pool, key=lambda h: h.score, reverse=True)[: self.width]

    def current(self) -> list[Hypothesis]:
        """While searching: the running beams, best first (what a streamed snapshot shows)."""
        return self.running if not self.done else self.best()


def logprobs_of(tokens: list[int]) -> list[float]:
    return [token_logprob(t) for t in tokens]
