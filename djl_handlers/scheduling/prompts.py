"""A request with several prompts (OpenAI completions with a list of prompts) in the rolling batch.

DJL's front end knows one slot per request, so the request stays one slot, a :class:`PromptGroup`.
Inside it each prompt (``Request.per_prompt``) is a slot of its own — a ``RequestSlot``, or a
``SampleGroup`` when it decodes several samples — with its own engine request(s), detokenizer,
stop rules and limits; a prompt whose choices are done is released from the engine at once while
the others go on. The group's ``RequestOutput`` lists every choice in ``sequences``, prompt by
prompt (``index`` = prompt × n + sample, as vLLM numbers them), and its formatter writes them as
it writes samples: all at the end, or streamed by index.

A failure of one prompt fails the request (its neighbours in the batch are untouched); a cancel
ends every prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from djl_handlers.engines.base import StepOutput
from djl_handlers.errors import InvalidParameter
from djl_handlers.extensions import STEP_TOKENS_KEY
from djl_handlers.formatting.base import Formatter
from djl_handlers.params.samples import returned_count, sample_count
from djl_handlers.request.records import Request, RequestOutput
from djl_handlers.scheduling.samples import SampleGroup
from djl_handlers.scheduling.slot import RequestSlot

__all__ = ["PromptGroup", "check_prompt_list", "engine_ids"]


def check_prompt_list(request: Request) -> None:
    """400 (naming ``best_of``) for several prompts whose samples would be ranked (``best_of`` >
    ``n``): each prompt's choices are returned in sample order (vLLM, whose V1 engine has no
    ``best_of``, refuses it too)."""
    params = request.params
    if request.per_prompt and returned_count(params) < sample_count(params):
        raise InvalidParameter("best_of > n cannot be combined with a list of prompts; send one prompt per "
                               "request or leave best_of out", field="best_of")


def engine_ids(slot: RequestSlot) -> list[int]:
    """The engine request ids ``slot`` holds: one, or one per sample or prompt still running."""
    return slot.engine_ids if isinstance(slot, (SampleGroup, PromptGroup)) else [slot.request_id]


class PromptGroup(RequestSlot):
    """One slot of the rolling batch whose request has several prompts (module docstring).

    ``parts``: one slot per prompt, in order, made by the batch (each already given its engine
    request ids); ``release(request_id)`` lets one engine request go (given by the batch)."""

    def __init__(self, request: Request, formatter: Formatter, request_id: int, parts: Sequence[RequestSlot],
                 release: Callable[[int], Any]) -> None:
        super().__init__(request, formatter, request_id)
        self.parts = list(parts)
        self._release_one = release
        self._by_id = {rid: part for part in self.parts for rid in engine_ids(part)}
        for part in self.parts:
            part.in_engine = True  # until the group lets it go (only while the group is in the engine)
        self.output.prompt_tokens = sum(part.output.prompt_tokens for part in self.parts)
        self.output.sequences = [seq for part in self.parts for seq in _choices(part.output)]

    @property
    def engine_ids(self) -> list[int]:
        """The request ids of the prompts (and their samples) the engine may still hold."""
        return [rid for part in self.parts if part.in_engine for rid in engine_ids(part)]

    def released(self) -> None:
        """The batch released every engine request still held."""
        for part in self.parts:
            part.in_engine = False
            if isinstance(part, SampleGroup):
                part.released()

    def consume(self, step: StepOutput) -> None:
        """Apply one engine output to the prompt it names."""
        part = self._by_id.get(step.request_id)
        if self.output.finished or part is None or part.finished:
            return
        if step.error is not None:
            self.fail(step.error)
            return
        part.consume(step)
        if part.output.error is not None:
            self.fail(part.output.error, part.output.error_code or 424)
            return
        if part.finished and part.in_engine and self.in_engine:
            for rid in engine_ids(part):
                self._release_one(rid)
            part.in_engine = False
            if isinstance(part, SampleGroup):
                part.released()
        if all(p.finished for p in self.parts):
            self.output.sequences = [seq for p in self.parts for seq in _choices(p.output)]
            self.finish(self.parts[-1].output.finish_reason or "length")

    def record(self) -> dict[str, Any]:
        """The group's record: the formatter sees every choice's new tokens of this step."""
        count = sum(len(seq.new_tokens) for seq in self.output.sequences)
        record = super().record()
        for seq in self.output.sequences:
            seq.new_tokens = []
        if self.output.error is None:
            record[STEP_TOKENS_KEY] = count
        return record

    def stats(self) -> str:
        """The last record's stats, counting the tokens of every choice."""
        out = self.output
        reason = "cancelled" if self.cancelled else (out.finish_reason or "")
        generated = sum(len(seq.tokens) for seq in out.sequences)
        return json.dumps({"prompt_tokens": out.prompt_tokens, "generated_tokens": generated, "finish_reason": reason},
                          separators=(",", ":"))


def _choices(out: RequestOutput) -> list[RequestOutput]:
    """The choices of one prompt: its samples, or itself."""
    return list(out.sequences) if out.sequences else [out]
