"""The small protocol every engine implements, and the records that cross it.

The scheduler (engine-agnostic) owns stopping criteria and detokenization for engines that
return bare token ids; engines that stop and detokenize themselves (vLLM, TensorRT-LLM) fill
``StepOutput.text`` and ``StepOutput.finish_reason`` and the scheduler trusts them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

from djl_handlers.errors import PromptTooLong

if TYPE_CHECKING:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.media.records import MediaInputs
    from djl_handlers.params.generation import GenerationParameters


@dataclass(frozen=True)
class EngineRequest:
    """A request as an engine sees it: token ids of the (already truncated) prompt; ``adapter``: the
    registered LoRA adapter to apply (None: the base model). ``sample_ids``: the ids of the request's
    further samples (``n``/``best_of`` > 1; ``request_id`` is sample 0): the engine prefills the
    prompt once and decodes one sequence per id, seeded per sample (``params.samples.sample_seed``, or
    the engine's own rule, its ``sample_seed`` attribute, which the scheduler then reports);
    outputs and ``release`` name each sample by its own id. Only engines whose parameter support
    table accepts ``n``/``best_of`` get any."""

    request_id: int
    prompt_ids: Sequence[int]
    params: GenerationParameters
    prompt: str = ""
    adapter: Optional[str] = None
    sample_ids: tuple[int, ...] = ()
    session: Optional[str] = None  # the stateful session it belongs to (the HF engine pins its prefix)
    media: Optional[MediaInputs] = None  # a vision-language prompt's images (engines that take them)


@dataclass(frozen=True)
class StepOutput:
    """What one engine step produced for one request.

    Exactly one of ``token_id`` or ``error`` is meaningful. ``text``/``finish_reason`` are set
    only by engines that detokenize / stop on their own.

    Optional extras, filled only for requests that asked for them:
    ``prompt_logprobs`` (``decoder_input_details``), on a request's first output only: one entry
    per prompt token, the log-prob of that token given the ones before it (the first is None);
    ``top_tokens`` (``top_n_tokens``): the N most likely ``(token_id, log_prob)`` of the
    distribution this token's ``log_prob`` comes from, most likely first;
    ``prompt_top_tokens`` (both ``decoder_input_details`` and ``top_n_tokens``), beside
    ``prompt_logprobs``: per prompt token, the N most likely tokens at that position (None for
    the first).
    """

    request_id: int
    token_id: int = -1
    log_prob: Optional[float] = None
    text: Optional[str] = None
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    prompt_logprobs: Optional[Sequence[Optional[float]]] = None
    top_tokens: Optional[Sequence[tuple[int, float]]] = None
    prompt_top_tokens: Optional[Sequence[Optional[Sequence[tuple[int, float]]]]] = None


def check_prompt_length(n: int, max_model_len: int) -> None:
    """The one prompt-length rule: ``PromptTooLong`` (field ``inputs``) unless the prompt has at
    least one token and leaves room for one generated token in ``max_model_len``."""
    if n == 0:
        raise PromptTooLong("inputs is empty after tokenization", field="inputs")
    if n >= max_model_len:
        raise PromptTooLong(
            f"inputs has {n} tokens but the model allows at most {max_model_len - 1} "
            f"(max_model_len {max_model_len}); shorten the prompt or set parameters.truncate",
            field="inputs",
        )


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the pipeline uses."""

    eos_token_id: Any

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class Engine(Protocol):
    """A continuous-batching engine.

    ``add_request`` queues a request (prefilled on the next ``step``); ``step`` advances every
    active request by one token and returns one ``StepOutput`` per active request; ``release``
    frees a finished or cancelled request's state (KV cache rows). A per-request failure is
    reported as ``StepOutput.error``; an exception from ``step`` means the whole batch failed.
    """

    name: str
    tokenizer: Tokenizer
    max_model_len: int
    eos_token_ids: frozenset[int]

    def add_request(self, request: EngineRequest) -> None: ...

    def step(self) -> list[StepOutput]: ...

    def release(self, request_id: int) -> None: ...

    def has_unfinished(self) -> bool: ...


@runtime_checkable
class StaticEngine(Protocol):
    """An engine with a dynamic-batch path: whole generations for a batch at once (``generate()``),
    one list of per-token outputs per request, in order."""

    def generate_static(self, requests: Sequence[EngineRequest]) -> list[list[StepOutput]]: ...


@runtime_checkable
class AsyncEngine(Protocol):
    """An engine with its own asynchronous API, awaited directly in DJL's async mode (vLLM's
    ``AsyncLLM``, TensorRT-LLM's ``generate_async``) instead of being stepped on a thread.

    ``generate_async`` runs one request: each item it yields holds that request's new
    ``StepOutput`` records since the previous item (several when the engine produced several
    tokens at once), the same records ``Engine.step`` returns; the last one carries the finish
    reason (or an error). Bad parameters or a rejected prompt raise the request's error
    (``InvalidParameter``, ``PromptTooLong``) from the first iteration. ``abort_async`` ends a
    request the caller stopped reading (a stop rule of ours, a cancel); a finished or unknown id
    is not an error. The engine also has ``name``, ``tokenizer``, ``max_model_len`` and
    ``eos_token_ids`` like ``Engine``.
    """

    def generate_async(self, request: EngineRequest) -> AsyncIterator[list[StepOutput]]: ...

    async def abort_async(self, request_id: int) -> None: ...


class EngineClass(Protocol):
    """What the registry returns for an engine name: a class built from the model's config."""

    def from_config(self, config: ServingConfig) -> Engine: ...
