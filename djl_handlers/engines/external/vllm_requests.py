"""A request as vLLM takes it: ``SamplingParams`` from our parameters (``params.translate.to_vllm``),
the prompt, and vLLM's rejections turned into the request's own 400 errors.

vLLM rejects a request with ``ValueError`` or, since 0.11, ``VLLMValidationError`` (not a
``ValueError``); ``AsyncLLM.generate`` re-raises the latter and wraps anything else in
``EngineGenerateError`` with the original as its cause, so the cause chain is searched.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest
from djl_handlers.engines.external.common import fit_kwargs, vllm_structured_kwargs
from djl_handlers.engines.external.vllm_media import has_images, image_prompt, tokenization_kwargs
from djl_handlers.errors import DjlHandlersError, InvalidParameter, PromptTooLong
from djl_handlers.params.generation import GenerationParameters


def sampling_params(vllm: Any, params: GenerationParameters, delta: bool = False) -> tuple[Any, bool]:
    """``(vllm.SamplingParams, is_delta)`` for ``params``; with ``delta`` the outputs are
    ``RequestOutputKind.DELTA`` when the installed vLLM has it (``is_delta`` says whether it does).
    Bad parameters raise ``InvalidParameter``."""
    from djl_handlers.params.translate import to_vllm

    kwargs = to_vllm(params)
    structured = kwargs.pop("structured_outputs", None)
    kwargs = fit_kwargs(vllm.SamplingParams, kwargs, "vllm")
    kind = _delta_kind(vllm) if delta else None
    if kind is not None:
        kwargs["output_kind"] = kind
    try:
        if structured is not None:
            kwargs.update(vllm_structured_kwargs(vllm, structured))
        return vllm.SamplingParams(**kwargs), kind is not None
    except (TypeError, ValueError) as exc:
        raise InvalidParameter(f"vLLM rejected the parameters: {exc}") from exc


def refuse_prompt_logprobs_with_lora(sampling: Any, loras: Any, on_cpu: bool | None = None) -> None:
    """400 for prompt log-probabilities (``decoder_input_details``, ``prompt_logprobs``, OpenAI ``echo``
    with ``logprobs``) while LoRA is enabled on vLLM's CPU build: there its LoRA logits path fails on
    them (an einsum shape error) and the failure stops the whole engine, every request with it."""
    if loras is None or getattr(sampling, "prompt_logprobs", None) is None:
        return
    if on_cpu is None:
        from vllm.platforms import current_platform

        on_cpu = bool(current_platform.is_cpu())
    if on_cpu:
        raise InvalidParameter(
            "prompt log-probabilities (decoder_input_details, prompt_logprobs, echo with logprobs) are not "
            "supported with option.enable_lora=true on vLLM's CPU build: its LoRA logits path fails on them and "
            "stops the engine", field="decoder_input_details")


def _delta_kind(vllm: Any) -> Any:
    """``RequestOutputKind.DELTA`` of the installed vLLM (0.6+), else None."""
    try:
        module = importlib.import_module(f"{vllm.__name__}.sampling_params")
    except ImportError:
        return None
    return getattr(getattr(module, "RequestOutputKind", None), "DELTA", None)


def prompt_of(request: EngineRequest) -> Any:
    """The prompt as vLLM takes it: the pipeline's token ids (already truncated), else the text; a
    prompt with images is its text with the images (``vllm_media.image_prompt``)."""
    if has_images(request):
        return image_prompt(request)
    return {"prompt_token_ids": list(request.prompt_ids)} if request.prompt_ids else request.prompt


def request_kwargs(request: EngineRequest) -> dict[str, Any]:
    """The other keywords of vLLM's ``add_request``/``generate`` for ``request``: how to tokenize a
    prompt with images."""
    return tokenization_kwargs(request) if has_images(request) else {}


def rejection(exc: BaseException, params: GenerationParameters) -> Optional[DjlHandlersError]:
    """The request's own error when ``exc`` is vLLM rejecting it (see the module docstring), else
    None: ``PromptTooLong`` for the prompt, ``InvalidParameter`` naming a structured-output
    constraint, else ``InvalidParameter``."""
    cause = _rejection_cause(exc)
    if cause is None:
        return None
    text = str(cause)
    if "prompt" in text.lower():
        return PromptTooLong(f"vLLM rejected the prompt: {text}", field="inputs")
    constraint = params.structured_output
    if constraint is not None:
        return InvalidParameter(f"vLLM rejected {constraint.describe()}: {text}", field=constraint.source)
    return InvalidParameter(f"vLLM rejected the request: {text}")


def _rejection_cause(exc: BaseException) -> Optional[BaseException]:
    seen = 0
    current: Optional[BaseException] = exc
    while current is not None and seen < 4:
        if isinstance(current, DjlHandlersError):
            return None
        if isinstance(current, ValueError) or type(current).__name__.endswith("ValidationError"):
            return current
        current, seen = current.__cause__, seen + 1
    return None
