"""transformers' beam-search rule over vLLM's top log-probs, for our own loop (:mod:`vllm_beam_loop`).

:class:`TransformersRule` is a :class:`~djl_handlers.engines.external.vllm_beam_rules.BeamRule` over
``BeamSearch`` (shared with the HF engine), what ``generate(num_beams=...)`` returns: the candidates it
keeps each step are the best ``K = max(2, 1 + len(eos)) x num_beams`` of every beam's every token, and
each of them is in its own beam's top ``K``, so the union of the beams' top ``K`` (every other token at
``NEG``) gives the same choice as the full vocabulary. It reports settled tokens as they grow (the
prefix no later step can change).

It steps torch tensors, so :func:`~djl_handlers.engines.external.vllm_beam_loop.beam_rule` imports this
module with the first request that takes this rule: importing the adapter pulls no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from djl_handlers.engines.base import StepOutput
from djl_handlers.engines.external.vllm_beam_rules import Tops
from djl_handlers.engines.hf.beams import NEG, BeamSearch, beam_outputs

__all__ = ["TransformersRule"]


class TransformersRule:
    """transformers' rule over vLLM's top log-probs (module docstring)."""

    def __init__(self, search: BeamSearch) -> None:
        self.search = search
        self.logprobs = search.keep
        self.live = search.live

    @property
    def done(self) -> bool:
        return self.search.done

    def asks(self) -> list[tuple[int, ...]]:
        """Beam 0 alone at first (every beam is the prompt; the others start at ``NEG``), then every beam."""
        if self.search.generated == 0:
            return [()]
        return [tokens for tokens, _ in self.search.running]

    def feed(self, tops: Sequence[Tops]) -> list[StepOutput]:
        """One step on the beams' top log-probs: a ``[num_beams, vocab]`` table at ``NEG`` but for them."""
        width = 1 + max((max(top) for top in tops if top), default=0)
        table = torch.full((self.search.num_beams, width), NEG, dtype=torch.float32)
        for beam, top in enumerate(tops):
            if top:
                table[beam, list(top)] = torch.tensor(list(top.values()), dtype=torch.float32)
        self.search.step(table, table)
        return beam_outputs(self.search)
