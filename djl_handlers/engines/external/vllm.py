"""vLLM adapter: the Engine protocol over vLLM's synchronous ``LLMEngine`` (sync mode).

In DJL's async mode ``VllmEngine.from_config`` builds the asynchronous adapter instead
(:class:`~djl_handlers.engines.external.vllm_async.VllmAsyncEngine`, vLLM's ``AsyncLLM``, as
vLLM's own server runs it). Both share the engine settings (``vllm_config``), the requests
(``vllm_requests``) and the conversion of outputs (``vllm_outputs``, whose docstring says how
vLLM's outputs become step outputs).

- Requests are added as ``{"prompt_token_ids": [...]}`` (the pipeline already tokenized and
  truncated the prompt) under ``request_id=str(EngineRequest.request_id)``, with
  ``vllm.SamplingParams(**to_vllm(params))``. Outputs are ``RequestOutputKind.CUMULATIVE``
  (``LLMEngine``'s default, available in every release). A request vLLM did not advance in a
  step (waiting for a slot, chunked prefill) gets no ``StepOutput``.
- ``release(id)`` calls ``abort_request([id])`` when vLLM has not finished the request (vLLM
  sends nothing for requests aborted by the caller).
- A vision-language model takes images (``vllm_media``): ``encode_media`` counts the image tokens with
  the model's processor, and a request with images is added as its text with
  ``multi_modal_data``/``multi_modal_uuids``.
- Several samples (``n``/``best_of`` > 1) are one vLLM request with ``SamplingParams.n``; each
  sample's outputs come under its own id (``vllm_samples``), and the request is aborted only once
  every sample is released.
- Beam search (``num_beams`` > 1) is a state machine per request across the steps (``vllm_beam_sync``):
  each step adds one one-token request per live beam beside the other requests; the rule is vLLM's
  own (as its loop in async mode) or, with ``early_stopping``, transformers' (``vllm_beam_loop``).

``option.rolling_batch=lmi-dist`` is served by this adapter too (``LmiDistEngine``): LMI-Dist is
not on PyPI, its documented parameter set is vLLM's, and the adapter logs which engine serves it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.common import fit_kwargs, import_engine_library, vllm_structured_kwargs
from djl_handlers.engines.external.vllm_async import VllmAsyncEngine
from djl_handlers.engines.external.vllm_beam_loop import beam_rule, check_beams, max_logprobs, step_sampling
from djl_handlers.engines.external.vllm_beam_sync import SyncBeams
from djl_handlers.engines.external.vllm_beams import is_beam_search
from djl_handlers.engines.external.vllm_config import (
    LMI_DIST_NOTICE,
    engine_args_kwargs,
    engine_tokenizer,
    eos_ids,
    is_lmi_dist,
    lora_kwargs,
    require_loras,
)
from djl_handlers.engines.external.vllm_media import (
    VllmImages,
    attach_images,
    check_prompt_count,
    encode_with,
    has_images,
)
from djl_handlers.engines.external.vllm_outputs import map_finish_reason
from djl_handlers.engines.external.vllm_parallel import ranks_started
from djl_handlers.engines.external.vllm_requests import (
    prompt_of,
    refuse_prompt_logprobs_with_lora,
    rejection,
    request_kwargs,
    sampling_params,
)
from djl_handlers.engines.external.vllm_samples import RequestTracks, request_outputs, vllm_sample_seed
from djl_handlers.errors import ConfigError

if TYPE_CHECKING:
    from djl_handlers.config.media import MediaOptions
    from djl_handlers.media.records import LoadedImage, MediaInputs

__all__ = ["LMI_DIST_NOTICE", "LmiDistEngine", "VllmEngine", "engine_args_kwargs", "lora_kwargs",
           "map_finish_reason", "vllm_structured_kwargs"]

LOG = logging.getLogger(__name__)

_KV_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


class VllmEngine:
    """The Engine protocol over ``vllm.LLMEngine`` (see the module docstring)."""

    name = "vllm"
    sample_seed = staticmethod(vllm_sample_seed)  # the seed of each sample (n > 1), as vLLM derives it

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.tokenizer = engine_tokenizer(engine)
        model_config = getattr(engine, "model_config", None) or engine.get_model_config()
        self.max_model_len = int(model_config.max_model_len)
        self.max_logprobs = max_logprobs(model_config)
        self.eos_token_ids = eos_ids(self.tokenizer)
        self._beams = SyncBeams(engine)  # beam requests, each a state machine over one-token requests
        self._tracks: dict[int, RequestTracks] = {}  # by vLLM request id (sample 0)
        self._owners: dict[int, int] = {}  # sample id -> vLLM request id
        self.loras: Any = None  # lora/external.py's EngineLoras with option.enable_lora=true
        self.images: VllmImages | None = None  # a vision-language model's processor (vllm_media)
        self.media_options: MediaOptions | None = None  # its image limits; None: text only
        self._prompt_counts: dict[int, int] = {}  # requests with images: the prompt tokens encode_media counted

    @classmethod
    def from_config(cls, config: Any) -> VllmEngine | VllmAsyncEngine:
        """Build ``LLMEngine.from_engine_args(EngineArgs(...))`` from a ServingConfig-like object;
        in async mode (``config.async_mode``) the asynchronous adapter over ``AsyncLLM`` instead."""
        if getattr(config, "async_mode", False):
            return VllmAsyncEngine.from_config(config, cls.name)
        vllm = import_engine_library("vllm", cls.name)
        lmi_dist = is_lmi_dist(cls.name, config)
        kwargs = fit_kwargs(vllm.EngineArgs, engine_args_kwargs(config), "vllm")
        images = VllmImages.load(config, kwargs["model"])  # a vision-language model's processor, before vLLM
        LOG.info("starting vLLM %s: %s", getattr(vllm, "__version__", "?"), kwargs)
        try:
            with ranks_started(vllm, config, kwargs):  # checks the degrees; CPU thread binding of the ranks
                engine = vllm.LLMEngine.from_engine_args(vllm.EngineArgs(**kwargs))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"vLLM rejected the engine options {kwargs}: {exc}", field="engine") from exc
        adapter = cls(engine)
        attach_images(adapter, config, images)
        if kwargs.get("enable_lora"):
            from djl_handlers.lora.external import vllm_loras

            adapter.loras = vllm_loras(engine)
        if lmi_dist:
            adapter.name = "lmi-dist (served by vLLM)"
        return adapter

    # -- Engine protocol ---------------------------------------------------------------------------
    def encode_media(self, prompt: str, images: Sequence[LoadedImage],
                     add_special_tokens: Optional[bool] = None) -> tuple[list[int], MediaInputs]:
        """A vision-language prompt's token ids as vLLM prefills them (image tokens included) and its
        media (``vllm_media``); a 400 naming ``messages`` for a text-only model."""
        return encode_with(self.images, prompt, images, add_special_tokens)

    def add_request(self, request: EngineRequest) -> None:
        """Queue ``request`` in vLLM; bad parameters raise ``InvalidParameter``, a prompt vLLM
        refuses ``PromptTooLong``."""
        vllm = import_engine_library("vllm", self.name)
        if is_beam_search(request):
            self._add_beams(vllm, request)
            return
        sampling, _ = sampling_params(vllm, request.params)
        refuse_prompt_logprobs_with_lora(sampling, self.loras)
        lora = {"lora_request": require_loras(self).request_for(request.adapter)} if request.adapter else {}
        try:
            self.engine.add_request(str(request.request_id), prompt_of(request), sampling, **request_kwargs(request),
                                    **lora)
        except Exception as exc:
            error = rejection(exc, request.params)
            if error is None:
                raise
            raise error from exc
        tracks = RequestTracks.for_request(request)
        self._tracks[request.request_id] = tracks
        if has_images(request):
            self._prompt_counts[request.request_id] = len(request.prompt_ids)
        self._owners.update((sample_id, request.request_id) for sample_id in tracks.ids)

    def _add_beams(self, vllm: Any, request: EngineRequest) -> None:
        """A beam request: its search starts (``vllm_beam_sync``; the rule: ``vllm_beam_loop``)."""
        check_beams(request, limit=self.max_logprobs, eos_ids=self.eos_token_ids, sync=True)
        eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        rule = beam_rule(request, eos_ids=self.eos_token_ids, eos_token_id=eos_token_id,
                         max_model_len=self.max_model_len)
        lora = {"lora_request": require_loras(self).request_for(request.adapter)} if request.adapter else {}
        try:
            self._beams.add(request, rule, step_sampling(vllm, rule.logprobs), lora)
        except Exception as exc:
            error = rejection(exc, request.params)
            if error is None:
                raise
            raise error from exc

    def step(self) -> list[StepOutput]:
        """Run one vLLM step; one ``StepOutput`` per new token of every request (sample) that advanced
        (a beam request: what its step gave)."""
        results: list[StepOutput] = []
        for output in self.engine.step():
            if self._beams.owns(output.request_id):
                self._beams.collect(output)
                continue
            rid = _int_id(output.request_id)
            tracks = self._tracks.get(rid) if rid is not None else None
            if tracks is None or not output.outputs:
                continue
            if rid in self._prompt_counts:
                check_prompt_count(rid, self._prompt_counts.pop(rid), output)
            results.extend(request_outputs(tracks, output, self.tokenizer))
        return results + self._beams.advance()

    def release(self, request_id: int) -> None:
        """Forget the request (or one sample of it); once every sample is let go, abort the
        request in vLLM if vLLM has not finished it."""
        if self._beams.release(request_id):
            return
        owner = self._owners.pop(request_id, None)
        tracks = self._tracks.get(owner) if owner is not None else None
        if owner is None or tracks is None or not tracks.release(request_id):
            return
        del self._tracks[owner]
        self._prompt_counts.pop(owner, None)
        if not tracks.finished:
            self.engine.abort_request([str(owner)])

    def has_unfinished(self) -> bool:
        return any(t.live for t in self._tracks.values()) or self._beams.has_unfinished()

    def kv_cache_usage(self) -> Optional[dict[str, float]]:
        """vLLM's own KV-cache figure (``vllm:kv_cache_usage_perc``, 0..1) from
        ``LLMEngine.get_metrics()``; None when this vLLM has no such reader or stats are off."""
        get_metrics = getattr(self.engine, "get_metrics", None)
        if not callable(get_metrics):
            return None
        for metric in get_metrics() or ():
            value = getattr(metric, "value", None)
            if getattr(metric, "name", None) in _KV_METRICS and isinstance(value, (int, float)):
                return {"kv_cache_usage": float(value)}
        return None

    # -- LoRA adapters (djl_handlers.lora) -----------------------------------------------------
    def load_adapter(self, spec: Any) -> None:
        """Register a LoRA adapter: ``add_lora`` (``pin_lora``) with its own ``LoRARequest``."""
        require_loras(self).load(spec)

    def unload_adapter(self, name: str) -> None:
        """Unregister a LoRA adapter (``remove_lora``)."""
        if self.loras is not None:
            self.loras.unload(name)


class LmiDistEngine(VllmEngine):
    """``option.rolling_batch=lmi-dist``: the LMI-Dist parameter set, served by vLLM."""

    name = "lmi-dist"


def _int_id(request_id: Any) -> Optional[int]:
    try:
        return int(request_id)
    except (TypeError, ValueError):
        return None
