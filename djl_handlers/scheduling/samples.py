"""A request that decodes several samples (``n``/``best_of`` > 1) in the rolling batch.

DJL's front end knows one slot per request (one position, one record per step), so the request
stays one slot, a :class:`SampleGroup`. Inside it each sample is a ``RequestSlot`` of its own with
its own engine request id (the engine prefills the prompt once and forks it, see
``EngineRequest.sample_ids``), detokenizer, stop rules and limits; a sample that finishes is released
from the engine at once while the others go on. The group's ``RequestOutput`` lists the samples'
outputs in ``sequences`` and its formatter writes them (``Formatter.samples``): all at the end, or
streamed by index. When every sample has finished and fewer are returned than decoded
(``best_of`` > ``n``), the samples are ranked by cumulative log-probability and the response shows
the best ones (``request.sequences.returned``); usage and stats count every decoded sample.

A failure of one sample fails the request (its neighbours in the batch are untouched); a cancel
ends every sample.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Optional

from djl_handlers.engines.base import StepOutput, Tokenizer
from djl_handlers.errors import InvalidParameter
from djl_handlers.extensions import STEP_TOKENS_KEY
from djl_handlers.formatting.base import SAMPLES_NONE, SAMPLES_STREAMED, Formatter
from djl_handlers.params.samples import check_samples, returned_count, sample_count, sample_field, sample_seed
from djl_handlers.params.translate import is_sampling
from djl_handlers.request.records import Request
from djl_handlers.request.sequences import best_first, ranked
from djl_handlers.scheduling.slot import RequestSlot

__all__ = ["SampleGroup", "check_sample_format"]


def check_sample_format(request: Request, formatter: Formatter) -> None:
    """400 (naming ``n`` or ``best_of``) when ``request`` asks for several samples that cannot be
    decoded (greedy) or that its response format cannot show (see ``Formatter.samples``)."""
    params = request.params
    count = sample_count(params)
    if count <= 1:
        return
    check_samples(params, is_sampling(params))
    name = sample_field(params)
    if formatter.samples == SAMPLES_NONE:
        shown = f"the {formatter.name} format" if formatter.name else "a custom output formatter"
        raise InvalidParameter(
            f"parameters.{name} > 1 cannot be answered in {shown}: several samples come back in one "
            "non-streaming response (LMI: details.best_of_sequences; OpenAI: choices, streamed too)",
            field=name,
        )
    if formatter.samples == SAMPLES_STREAMED and returned_count(params) < count:
        raise InvalidParameter(
            f"parameters.best_of ({count}) > n ({returned_count(params)}) cannot be streamed: which samples "
            "are returned is known only when all have finished",
            field="best_of",
        )


class SampleGroup(RequestSlot):
    """One slot of the rolling batch whose request decodes several samples (module docstring).

    ``release(request_id)`` lets one finished sample go from the engine (given by the batch);
    ``seed_of(seed, index)`` is the seed the engine draws sample ``index`` with (reported per sample;
    default ``params.samples.sample_seed``, an engine may have its own rule: ``Engine.sample_seed``)."""

    def __init__(
        self,
        request: Request,
        formatter: Formatter,
        sample_ids: Sequence[int],
        prompt_ids: Sequence[int],
        *,
        tokenizer: Optional[Tokenizer],
        eos_token_ids: frozenset[int],
        max_model_len: int,
        release: Callable[[int], Any],
        seed_of: Callable[[Optional[int], int], Optional[int]] = sample_seed,
    ) -> None:
        super().__init__(request, formatter, sample_ids[0], prompt_ids)
        self.samples = [
            RequestSlot(replace(request, seed=seed_of(request.seed, i)), formatter, request_id, prompt_ids,
                        tokenizer=tokenizer, eos_token_ids=eos_token_ids, max_model_len=max_model_len)
            for i, request_id in enumerate(sample_ids)
        ]
        for sample in self.samples:
            sample.in_engine = True  # until the group lets it go (only while the group is in the engine)
        self._by_id = {sample.request_id: sample for sample in self.samples}
        self._release_one = release
        self.output.sequences = [sample.output for sample in self.samples]

    @property
    def engine_ids(self) -> list[int]:
        """The request ids of the samples the engine may still hold."""
        return [sample.request_id for sample in self.samples if sample.in_engine]

    def released(self) -> None:
        """The batch released every sample still in the engine."""
        for sample in self.samples:
            sample.in_engine = False

    def consume(self, step: StepOutput) -> None:
        """Apply one engine output to the sample it names."""
        sample = self._by_id.get(step.request_id)
        if self.output.finished or sample is None or sample.finished:
            return
        if step.error is not None:
            self.fail(step.error)
            return
        sample.consume(step)
        if not sample.finished:
            return
        if sample.in_engine and self.in_engine:
            sample.in_engine = False
            self._release_one(sample.request_id)
        if all(s.finished for s in self.samples):
            self._complete()

    def _complete(self) -> None:
        if returned_count(self.request.params) < len(self.samples):
            self.output.sequences = ranked(self.output.sequences)  # the response shows the best ones
        self.finish(best_first(self.output)[0].finish_reason or "length")

    def record(self) -> dict[str, Any]:
        """The group's record: the formatter sees every sample's new tokens of this step."""
        count = sum(len(sample.output.new_tokens) for sample in self.samples)
        record = super().record()
        for sample in self.samples:
            sample.output.new_tokens = []
        if self.output.error is None:
            record[STEP_TOKENS_KEY] = count
        return record

    def stats(self) -> str:
        """The last record's stats, counting the tokens of every sample."""
        out = self.output
        reason = "cancelled" if self.cancelled else (out.finish_reason or "")
        generated = sum(len(sample.output.tokens) for sample in self.samples)
        return json.dumps({"prompt_tokens": out.prompt_tokens, "generated_tokens": generated, "finish_reason": reason},
                          separators=(",", ":"))
