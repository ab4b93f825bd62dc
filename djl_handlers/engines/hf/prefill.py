"""Prompt log-probs for ``decoder_input_details``: the prefill forward's final hidden states,
captured by a hook, scored by the model's output head (only for requests that ask)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from djl_handlers.engines.hf.sampling import prompt_log_probs

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


def prompt_lps(
    model: Any,
    hidden: torch.Tensor | None,
    row: int,
    start: int,
    stop: int,
    targets: Sequence[int],
    prefix: list[float | None],
) -> list[float | None]:
    """``prefix`` + the log-probs of ``targets`` predicted by ``hidden[row, start:stop]``
    (None for each when the hidden states are unknown)."""
    if hidden is None or stop <= start:
        return prefix + [None] * max(0, stop - start)
    head = model.get_output_embeddings()
    return prefix + prompt_log_probs(head, hidden[row, start:stop], list(targets)[: stop - start])
