"""Dynamic (static) batch mode: whole generations for a batch of requests at once.

Requests with different parameters are grouped, not rejected: each group of identical
``GenerationParameters`` runs as one padded batch through ``engine.generate_static`` (the
engine's ``generate()`` path) when the engine has it, else through the step loop. The same
``RequestSlot`` logic as the rolling batch turns token ids into text and applies stops, so both
modes agree on text, stop sequences and finish reasons. Several samples of a prompt
(``n``/``best_of`` > 1) are a rolling-batch feature: here they are a 400.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any, Optional

from djl_handlers.engines.base import Engine, EngineRequest, StaticEngine, StepOutput
from djl_handlers.errors import InvalidParameter, error_body, output_error_body
from djl_handlers.formatting.base import Formatter
from djl_handlers.media.records import MediaInputs
from djl_handlers.params.samples import sample_count, sample_field
from djl_handlers.request.records import Request, RequestOutput
from djl_handlers.scheduling.media import tokenize_media
from djl_handlers.scheduling.slot import RequestSlot, tokenize_prompt

_IDS = count(1 << 40)


class _NoFormatter(Formatter):
    """Dynamic batches build their bodies from the slots' outputs, not per step."""

    content_type = "application/json"

    def __call__(self, out: RequestOutput) -> str:
        return ""


def refuse_samples(request: Request) -> None:
    """400 for ``n``/``best_of`` > 1: dynamic batching decodes one sequence per prompt."""
    if sample_count(request.params) > 1:
        name = sample_field(request.params)
        raise InvalidParameter(f"parameters.{name} > 1 needs rolling batch (option.rolling_batch); dynamic "
                               "batching decodes one sequence per prompt", field=name)


def refuse_rolling_only(request: Request) -> None:
    """400 for what only the rolling batch answers: a list of prompts in one OpenAI completions
    request, and ``echo`` with the prompt's log-probabilities (``generate()`` reports none)."""
    if request.per_prompt:
        raise InvalidParameter("a list of prompts needs rolling batch (option.rolling_batch); send one "
                               "prompt per request", field="prompt")
    options = request.response_options
    if options.echo and options.logprobs is not None:
        raise InvalidParameter("echo with logprobs (the prompt's log-probabilities) needs rolling batch "
                               "(option.rolling_batch)", field="echo")


def _prompts(request: Request) -> list[str]:
    return [request.inputs] if isinstance(request.inputs, str) else list(request.inputs)


@dataclass(frozen=True)
class FormattedBody:
    """A request's whole answer in its own dialect (OpenAI, TGI ...), with its Content-Type."""

    text: str
    content_type: str


FormatterFor = Callable[[Request], Optional[Any]]


def _new_slot(engine: Engine, request: Request, prompt: str, index: int = 0,
              whole: bool = False) -> tuple[RequestSlot, list[int]]:
    """A slot for prompt ``index``; ``whole`` keeps the request itself (a formatter needs its dialect fields)."""
    if request.media:  # one prompt with images: the processor's ids; the media stay on the request
        ids = tokenize_media(engine, request)[0]
        whole = True
    else:
        ids = tokenize_prompt(engine, request, None if whole else prompt)
    adapter = request.adapter_of(index)
    sub = request if whole else Request(prompt=prompt, params=request.params, inputs=prompt,
                                        adapters=(adapter,) if adapter else ())
    slot = RequestSlot(
        sub, _NoFormatter(), next(_IDS), ids, engine.tokenizer, engine.eos_token_ids, engine.max_model_len
    )
    return slot, ids


def _media_of(slot: RequestSlot) -> Optional[MediaInputs]:
    """The media of a slot's prompt with images (prepared by ``tokenize_media``), else None."""
    encoded = slot.request.encoded
    return encoded[1] if encoded is not None else None


def run_dynamic_batch(engine: Engine, requests: Sequence[Request],
                      formatter_for: Optional[FormatterFor] = None) -> list[Any]:
    """One body per request: ``[{"generated_text": ...}, ...]`` (one per prompt) or an error body.

    ``formatter_for(request)`` may name a formatter for a request that asked for another dialect
    (the OpenAI and TGI routes, ``option.tgi_compat`` ...): that request's body is then the
    formatter's whole answer, a ``FormattedBody``, as rolling batch would have sent it.
    """
    slots: dict[int, list[RequestSlot]] = {}
    formatters: dict[int, Any] = {}
    errors: dict[int, Any] = {}
    groups: dict[Any, list[tuple[RequestSlot, list[int]]]] = defaultdict(list)
    check = getattr(engine, "check_parameters", None)  # engines that can reject parameters up front
    for index, request in enumerate(requests):
        try:
            refuse_samples(request)
            refuse_rolling_only(request)
            if check is not None:
                check(request.params)
            formatter = formatter_for(request) if formatter_for is not None else None
            if formatter is not None and (isinstance(request.inputs, str) or request.prompt_ids is not None):
                formatters[index] = formatter
                made = [_new_slot(engine, request, request.prompt, whole=True)]
            else:
                made = [_new_slot(engine, request, p, i) for i, p in enumerate(_prompts(request))]
        except Exception as exc:  # noqa: BLE001 - this request's own error
            errors[index] = error_body(exc)
            continue
        slots[index] = [s for s, _ in made]
        groups[request.params].extend(made)
    for members in groups.values():
        _run_group(engine, members)
    bodies: list[Any] = []
    for index in range(len(requests)):
        if index in errors:
            bodies.append(errors[index])
        elif index in formatters:
            output = slots[index][0].output
            output.new_tokens = list(output.tokens)  # the formatter sees the whole generation as one step
            bodies.append(FormattedBody(formatters[index](output), formatters[index].content_type))
        elif any(s.output.error for s in slots[index]):
            failed = next(s for s in slots[index] if s.output.error)
            bodies.append(output_error_body(failed.output.error_code or 424, failed.output.error or ""))
        else:
            bodies.append([{"generated_text": s.output.full_text} for s in slots[index]])
    return bodies


def _run_group(engine: Engine, members: list[tuple[RequestSlot, list[int]]]) -> None:
    reqs = [EngineRequest(s.request_id, ids, s.request.params, s.request.prompt, s.request.adapter_of(0),
                          media=_media_of(s)) for s, ids in members]
    try:
        if isinstance(engine, StaticEngine) and not any(r.media for r in reqs):  # generate() takes no images
            for (slot, _), outputs in zip(members, engine.generate_static(reqs), strict=True):
                for step in outputs:
                    slot.consume(step)
                    if slot.finished:
                        break
                slot.finish("length")  # generate() stopped on its own limits
        else:
            _step_loop(engine, reqs, {s.request_id: s for s, _ in members})
    except Exception as exc:  # noqa: BLE001 - fail this group only
        for slot, _ in members:
            slot.fail(f"generation failed: {exc}")


def _step_loop(engine: Engine, reqs: list[EngineRequest], by_id: dict[int, RequestSlot]) -> None:
    live: set[int] = set()
    try:
        for req in reqs:
            engine.add_request(req)
            live.add(req.request_id)
        while live:
            for step in engine.step():
                slot = by_id.get(step.request_id)
                if slot is not None:
                    slot.consume(step)
            for rid in [r for r in live if by_id[r].finished]:
                engine.release(rid)
                live.discard(rid)
    finally:  # a failed step must not leave requests behind in the engine
        for rid in live:
            engine.release(rid)


def stream_dynamic_request(engine: Engine, request: Request) -> Iterator[list[str]]:
    """Streaming for one dynamic-batch request: yields, per step, the new text of each prompt
    (DJL's default stream formatter turns each list into an ``{"outputs": [...]}`` line)."""
    refuse_samples(request)
    made = [_new_slot(engine, request, p, i) for i, p in enumerate(_prompts(request))]
    by_id = {s.request_id: s for s, _ in made}
    for slot, ids in made:
        engine.add_request(EngineRequest(slot.request_id, ids, request.params, slot.request.prompt,
                                         slot.request.adapter_of(0), media=_media_of(slot)))
    live = set(by_id)
    try:
        while live:
            steps: list[StepOutput] = engine.step()
            for step in steps:
                if step.request_id in by_id:
                    by_id[step.request_id].consume(step)
            line = []
            for slot, _ in made:
                line.append("".join(t.text for t in slot.output.new_tokens))
                slot.output.new_tokens = []
                if slot.output.error:
                    raise RuntimeError(slot.output.error)
            for rid in [r for r in live if by_id[r].finished]:
                engine.release(rid)
                live.discard(rid)
            yield line
    finally:
        for rid in live:
            engine.release(rid)
