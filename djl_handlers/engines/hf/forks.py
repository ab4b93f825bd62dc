"""Several samples of one prompt on the HF engine (``n``/``best_of`` > 1): the prompt is prefilled
once, as one row; right after that forward its further samples become rows of their own whose KV
starts as copies of the prefilled row's (``KVBatch.repeat_rows``), each with its own sampler (seeded
by ``params.samples.sample_seed``), grammar matcher and request id. From then on a sample is an
ordinary row: it decodes, is released and leaves the batch on its own. The beams of a beam-search
request fork the same way (``Row.beam_forks``, :func:`djl_handlers.engines.hf.beam_rows.fork_beams`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

import torch

from djl_handlers.engines.hf.batch import KVBatch
from djl_handlers.engines.hf.beam_rows import fork_beams
from djl_handlers.engines.hf.rows import Row
from djl_handlers.engines.hf.sampling import RowSampling
from djl_handlers.errors import InvalidParameter
from djl_handlers.params.samples import check_samples, sample_count, sample_field, sample_seed
from djl_handlers.params.translate import is_sampling, translate

__all__ = ["check_sample_rows", "fan_out", "fork_rows"]

PromptLps = list[list[float | None] | None] | None


def check_sample_rows(params: Any, max_batch_size: int) -> None:
    """400 unless the request's samples may run: sampling (not greedy) and no more samples than
    rows in the batch (``option.max_rolling_batch_size``; each sample is one row)."""
    check_samples(params, is_sampling(params))
    count = sample_count(params)
    if count > max_batch_size:
        name = sample_field(params)
        raise InvalidParameter(
            f"parameters.{name} is {count} but every sample is one row of the running batch, which has "
            f"{max_batch_size} (option.max_rolling_batch_size): ask for at most {max_batch_size}",
            field=name,
        )


def fork_rows(row: Row, engine_name: str, vocab_size: int, eos_token_ids: Collection[int]) -> list[Row]:
    """The rows of ``row``'s further samples (its ``forks``, emptied), in sample order; or of its
    further beams (``beam_forks``)."""
    if row.beam_forks:
        return fork_beams(row)
    request = row.request
    params = request.params
    settings = translate(params, engine_name)
    forks = []
    for index, request_id in row.forks:
        seed = sample_seed(params.seed, index)
        sampling = RowSampling.from_settings(settings, seed, request.prompt_ids, vocab_size, eos_token_ids,
                                             row.sampling.tokenizer)
        grammar = row.grammar.fork() if row.grammar is not None else None
        forks.append(Row(replace(request, request_id=request_id, sample_ids=()), sampling, prompt_lp=row.prompt_lp,
                         top_n=row.top_n, lora=row.lora, grammar=grammar))
    row.forks = []
    return forks


def fan_out(
    batch: KVBatch, logits: torch.Tensor, prompt_lps: PromptLps, make: Callable[[Row], list[Row]]
) -> tuple[torch.Tensor, PromptLps]:
    """After a prefill forward: give every row with forks one batch row per sample (its KV row,
    last-position logits and prompt log-probs repeated); rows without forks stay as they are."""
    if not any(row.forks or row.beam_forks for row in batch.rows):
        return logits, prompt_lps
    order: list[int] = []
    rows: list[Row] = []
    for i, row in enumerate(batch.rows):
        forks = make(row)
        order += [i] * (1 + len(forks))
        rows += [row, *forks]
    batch.repeat_rows(order)
    batch.rows = rows
    idx = torch.tensor(order, dtype=torch.long, device=logits.device)
    return logits[idx], ([prompt_lps[i] for i in order] if prompt_lps is not None else None)
