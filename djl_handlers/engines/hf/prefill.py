"""Prompt log-probs for ``decoder_input_details``: the prefill forward's final hidden states,
captured by a hook, scored by the model's output head (only for requests that ask).

A request that also asks for ``top_n_tokens`` gets each prompt position's N most likely tokens
(what OpenAI's ``echo`` with ``logprobs: N`` shows): :class:`PromptScores` is the list of
log-probs the engine already carries through its prefill paths, with those top tokens beside it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

LOG = logging.getLogger(__name__)


def forward_capturing(model: Any, forward: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward's last-position logits and the final hidden states [batch, len, H] (the decoder's
    output, captured by a forward hook; the logits are exactly what ``forward`` returns).
    The hidden states are None when the output head applied to them does not reproduce the
    model's logits (a model that scales or caps its logits): the prompt log-probs are then
    unknown rather than wrong."""
    captured: list[torch.Tensor] = []
    decoder = model.base_model
    handle = decoder.register_forward_hook(lambda _m, _a, out: captured.append(out[0]))
    try:
        logits = forward()
    finally:
        handle.remove()
    hidden = captured[-1] if captured else None
    if hidden is not None:
        check = model.get_output_embeddings()(hidden[:, -1:, :])[:, -1].float()
        if not torch.allclose(check, logits, rtol=1e-3, atol=1e-3):
            hidden = None
    if hidden is None:
        LOG.warning("%s: prompt log-probs are not available (its logits are not lm_head(hidden))",
                    type(model).__name__)
    return logits, hidden


TopTokens = list[tuple[int, float]]


class PromptScores(list[float | None]):
    """One log-prob per prompt token (None where unknown: the first token), and ``top``: per
    position, its ``top_n`` most likely ``(token_id, log_prob)`` (None where not computed; ``top``
    is None when no position's were)."""

    def __init__(self, lps: Sequence[float | None] = (), top: Sequence[TopTokens | None] = ()) -> None:
        super().__init__(lps)
        self.positions: list[TopTokens | None] = list(top) + [None] * max(0, len(lps) - len(top))

    @property
    def top(self) -> list[TopTokens | None] | None:
        return self.positions if any(t is not None for t in self.positions) else None


def prompt_lps(
    model: Any,
    hidden: torch.Tensor | None,
    row: int,
    start: int,
    stop: int,
    targets: Sequence[int],
    prefix: list[float | None],
    top_n: int = 0,
) -> PromptScores:
    """``prefix`` + the log-probs of ``targets`` predicted by ``hidden[row, start:stop]``
    (None for each when the hidden states are unknown), with each position's ``top_n`` most
    likely tokens when ``top_n`` > 0 (a ``PromptScores`` prefix keeps its own)."""
    old_top = prefix.positions if isinstance(prefix, PromptScores) else []
    if hidden is None or stop <= start:
        count = max(0, stop - start)
        return PromptScores([*prefix, *([None] * count)], [*old_top, *([None] * (len(prefix) - len(old_top) + count))])
    head = model.get_output_embeddings()
    lps, top = score_positions(head, hidden[row, start:stop], list(targets)[: stop - start], top_n)
    old_top = old_top + [None] * (len(prefix) - len(old_top))
    return PromptScores([*prefix, *lps], [*old_top, *top])


def score_positions(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: Sequence[int],
    top_n: int = 0,
    chunk: int = 256,
) -> tuple[list[float | None], list[TopTokens | None]]:
    """``log_softmax(head(hidden[j]))[targets[j]]`` for every position ``j`` of ``hidden`` [n, H]
    (the log-prob of the token that follows position ``j``) and, when ``top_n`` > 0, the ``top_n``
    most likely tokens there; ``chunk`` positions at a time so the [chunk, vocab] logits stay small."""
    want = torch.as_tensor(list(targets), dtype=torch.long, device=hidden.device)
    lps: list[float | None] = []
    tops: list[TopTokens | None] = []
    for start in range(0, int(hidden.shape[0]), chunk):
        x = head(hidden[start : start + chunk]).float()
        log_z = torch.logsumexp(x, dim=-1)
        picked = x.gather(1, want[start : start + chunk].unsqueeze(1)).squeeze(1)
        lps += (picked - log_z).tolist()
        if top_n > 0:
            values, ids = torch.topk(x, min(top_n, int(x.shape[-1])), dim=-1)
            top_lps = (values - log_z.unsqueeze(1)).tolist()
            tops += [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), top_lps, strict=True)]
        else:
            tops += [None] * int(x.shape[0])
    return lps, tops
