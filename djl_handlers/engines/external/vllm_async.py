"""vLLM in DJL's async mode: the asynchronous engine vLLM's own OpenAI server runs (``AsyncLLM``).

``VllmEngine.from_config`` builds this adapter when ``config.async_mode`` is set:
``AsyncLLM.from_engine_args(AsyncEngineArgs(...))`` (``vllm.v1.engine.async_llm``; older releases:
``vllm.AsyncLLMEngine``) with the same engine settings as the synchronous adapter. vLLM's engine
core runs in its own process and an output task on the caller's event loop (started when the
engine is built inside a running loop, else by the first request), so the engine must be used
from the one event loop that built it or served its first request; DJL's async worker and ours
run init and requests on one loop.

Per request (:class:`~djl_handlers.engines.base.AsyncEngine`):

- ``generate_async`` awaits ``engine.generate({"prompt_token_ids": [...]}, SamplingParams(...),
  str(request_id), lora_request=...)`` with ``output_kind=RequestOutputKind.DELTA`` (cumulative
  outputs on a vLLM without it) and turns each ``RequestOutput`` into step outputs exactly as the
  synchronous adapter does (``vllm_outputs``). A request vLLM rejects raises its 400 error
  (``vllm_requests.rejection``) from the first iteration.
- ``abort_async`` is ``engine.abort(str(request_id))``: async mode calls it when it stops reading
  a request (a stop rule of ours, a cancel, a client that went away); closing the stream does the
  same inside vLLM.
- Beam search (``num_beams``) is vLLM's own loop over this engine (``vllm_beams``); with
  ``early_stopping``, our loop with transformers' rule (``vllm_beam_loop``): each step's one-token
  requests run together, settled tokens are yielded as they grow.
- A vision-language model takes images as in sync mode (``vllm_media``): ``generate`` gets the text
  with ``multi_modal_data``/``multi_modal_uuids``; a beam search, vLLM's rendered input.
- Several samples (``n``/``best_of`` > 1) are one ``generate`` with ``SamplingParams.n``; each
  sample's outputs come under its own id (``vllm_samples``); ``release(id)`` lets one sample go
  (it finished by a rule of ours), and the stream ends when no sample is left to read.

LoRA: DJL's adapter API registers adapters synchronously, but ``AsyncLLM.add_lora``/``pin_lora``/
``remove_lora`` are coroutines: registration checks the folder and the rank (``max_lora_rank``)
at once and schedules vLLM's call on the running loop (a failure is logged; vLLM also loads an
adapter from its folder with the first request that names it).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.common import fit_kwargs, import_engine_library
from djl_handlers.engines.external.vllm_beam_loop import (
    beam_rule,
    check_beams,
    max_logprobs,
    own_beam_outputs,
    step_sampling,
    wants_transformers_rule,
)
from djl_handlers.engines.external.vllm_beams import beam_search_outputs, is_beam_search
from djl_handlers.engines.external.vllm_config import (
    engine_args_kwargs,
    engine_tokenizer,
    eos_ids,
    is_lmi_dist,
    require_loras,
)
from djl_handlers.engines.external.vllm_media import (
    VllmImages,
    attach_images,
    check_prompt_count,
    encode_with,
    has_images,
)
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

__all__ = ["VllmAsyncEngine", "async_llm_class"]

LOG = logging.getLogger(__name__)


def async_llm_class(vllm: Any) -> Any:
    """vLLM's asynchronous engine class: ``vllm.v1.engine.async_llm.AsyncLLM``, else (releases
    before V1) ``vllm.AsyncLLMEngine`` (the same ``generate``/``abort`` API)."""
    try:
        return importlib.import_module(f"{vllm.__name__}.v1.engine.async_llm").AsyncLLM
    except (ImportError, AttributeError):
        return vllm.AsyncLLMEngine


class VllmAsyncEngine:
    """The :class:`~djl_handlers.engines.base.AsyncEngine` protocol over vLLM's ``AsyncLLM``
    (see the module docstring)."""

    name = "vllm"
    sample_seed = staticmethod(vllm_sample_seed)  # the seed of each sample (n > 1), as vLLM derives it

    def __init__(self, engine: Any, vllm: Any) -> None:
        self.engine = engine
        self._vllm = vllm
        self.tokenizer = engine_tokenizer(engine)
        self.max_model_len = int(engine.model_config.max_model_len)
        self.max_logprobs = max_logprobs(engine.model_config)
        self.eos_token_ids = eos_ids(self.tokenizer)
        self.loras: Any = None  # lora/external.py's EngineLoras with option.enable_lora=true
        self._unfinished: set[int] = set()  # requests vLLM has not finished (abort_async skips the others)
        self._samples: dict[int, RequestTracks] = {}  # sample id -> its running request's tracks
        self.images: VllmImages | None = None  # a vision-language model's processor (vllm_media)
        self.media_options: MediaOptions | None = None  # its image limits; None: text only

    @classmethod
    def from_config(cls, config: Any, engine_name: str = "vllm") -> VllmAsyncEngine:
        """Build ``AsyncLLM.from_engine_args(AsyncEngineArgs(...))`` from a ServingConfig-like object."""
        vllm = import_engine_library("vllm", engine_name)
        lmi_dist = is_lmi_dist(engine_name, config)
        kwargs = fit_kwargs(vllm.AsyncEngineArgs, engine_args_kwargs(config), "vllm")
        images = VllmImages.load(config, kwargs["model"])  # a vision-language model's processor, before vLLM
        LOG.info("starting vLLM %s (AsyncLLM, async mode): %s", getattr(vllm, "__version__", "?"), kwargs)
        try:
            with ranks_started(vllm, config, kwargs):  # checks the degrees; CPU thread binding of the ranks
                engine = async_llm_class(vllm).from_engine_args(vllm.AsyncEngineArgs(**kwargs))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"vLLM rejected the engine options {kwargs}: {exc}", field="engine") from exc
        adapter = cls(engine, vllm)
        attach_images(adapter, config, images)
        if kwargs.get("enable_lora"):
            from djl_handlers.lora.external import vllm_loras

            adapter.loras = vllm_loras(_ScheduledLoraCalls(engine, int(kwargs.get("max_lora_rank") or 16)))
        if lmi_dist:
            adapter.name = "lmi-dist (served by vLLM)"
        return adapter

    # -- AsyncEngine protocol ----------------------------------------------------------------------
    def encode_media(self, prompt: str, images: Sequence[LoadedImage],
                     add_special_tokens: Optional[bool] = None) -> tuple[list[int], MediaInputs]:
        """A vision-language prompt's token ids as vLLM prefills them (image tokens included) and its
        media (``vllm_media``); a 400 naming ``messages`` for a text-only model."""
        return encode_with(self.images, prompt, images, add_special_tokens)

    async def generate_async(self, request: EngineRequest) -> AsyncIterator[list[StepOutput]]:
        """Run ``request`` in vLLM; yields its new step outputs per ``RequestOutput``."""
        if is_beam_search(request):
            async for outs in self._beam_search(request):
                yield outs
            return
        sampling, delta = sampling_params(self._vllm, request.params, delta=True)
        refuse_prompt_logprobs_with_lora(sampling, self.loras)
        lora = {"lora_request": require_loras(self).request_for(request.adapter)} if request.adapter else {}
        rid = request.request_id
        tracks = RequestTracks.for_request(request)
        stream = self.engine.generate(prompt_of(request), sampling, str(rid), **request_kwargs(request), **lora)
        started = False
        counted = len(request.prompt_ids) if has_images(request) else None
        self._unfinished.add(rid)
        self._samples.update((sample_id, tracks) for sample_id in tracks.ids)
        try:
            async for output in stream:
                if not started and counted is not None:
                    check_prompt_count(rid, counted, output)
                started = True
                outs = request_outputs(tracks, output, self.tokenizer, delta) if output.outputs else []
                if tracks.finished:
                    self._unfinished.discard(rid)
                if outs:
                    yield outs
                if not tracks.live:
                    return
        except Exception as exc:
            error = None if started else rejection(exc, request.params)
            if error is None:
                raise
            raise error from exc
        finally:
            self._unfinished.discard(rid)
            for sample_id in tracks.ids:
                self._samples.pop(sample_id, None)
            await stream.aclose()

    async def _beam_search(self, request: EngineRequest) -> AsyncIterator[list[StepOutput]]:
        """vLLM's own beam-search loop (``vllm_beams``), or with ``early_stopping`` ours (``vllm_beam_loop``)."""
        check_beams(request, limit=self.max_logprobs, eos_ids=self.eos_token_ids, sync=False)
        lora = require_loras(self).request_for(request.adapter) if request.adapter else None
        if not wants_transformers_rule(request.params):
            async for outs in beam_search_outputs(self.engine, request, lora):
                yield outs
            return
        eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        rule = beam_rule(request, eos_ids=self.eos_token_ids, eos_token_id=eos_token_id,
                         max_model_len=self.max_model_len)
        sampling = step_sampling(self._vllm, rule.logprobs)
        async for outs in own_beam_outputs(self.engine, request, rule, sampling,
                                           {"lora_request": lora} if lora is not None else {}):
            yield outs

    def release(self, request_id: int) -> None:
        """One sample of a request with several finished by a rule of ours: its further outputs are
        dropped (the request's stream ends, aborting it in vLLM, once no sample is left to read)."""
        tracks = self._samples.get(request_id)
        if tracks is not None:
            tracks.release(request_id)

    async def abort_async(self, request_id: int) -> None:
        """End the request in vLLM (``AsyncLLM.abort``); an unknown or finished id does nothing."""
        if request_id in self._unfinished:
            self._unfinished.discard(request_id)
            await self.engine.abort(str(request_id))

    def close(self) -> None:
        """Stop vLLM's engine-core process."""
        shutdown = getattr(self.engine, "shutdown", None)
        if callable(shutdown):
            shutdown()

    # -- LoRA adapters (djl_handlers.lora) -----------------------------------------------------
    def load_adapter(self, spec: Any) -> None:
        """Register a LoRA adapter (its ``LoRARequest``; vLLM's ``add_lora`` is scheduled)."""
        require_loras(self).load(spec)

    def unload_adapter(self, name: str) -> None:
        """Unregister a LoRA adapter (vLLM's ``remove_lora`` is scheduled)."""
        if self.loras is not None:
            self.loras.unload(name)


class _ScheduledLoraCalls:
    """``add_lora``/``pin_lora``/``remove_lora`` of an ``AsyncLLM`` as plain calls, the shape
    ``lora.external.vllm_loras`` takes: each checks what it can at once and schedules vLLM's
    coroutine on the running event loop."""

    def __init__(self, engine: Any, max_lora_rank: int) -> None:
        self._engine = engine
        self._max_rank = max_lora_rank
        self._tasks: set[asyncio.Task[Any]] = set()

    def add_lora(self, lora_request: Any) -> None:
        rank = _adapter_rank(lora_request.lora_path)
        if rank is not None and rank > self._max_rank:  # vLLM's own check, made before the call
            raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {self._max_rank}.")
        self._schedule(lambda: self._engine.add_lora(lora_request), f"add_lora({lora_request.lora_name})")

    def pin_lora(self, lora_id: int) -> None:
        self._schedule(lambda: self._engine.pin_lora(lora_id), f"pin_lora({lora_id})")

    def remove_lora(self, lora_id: int) -> None:
        self._schedule(lambda: self._engine.remove_lora(lora_id), f"remove_lora({lora_id})")

    def _schedule(self, call: Callable[[], Coroutine[Any, Any, Any]], what: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            LOG.warning("vLLM %s not sent: no running event loop (vLLM loads an adapter with its first request)",
                        what)
            return
        task = loop.create_task(call())
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finished(done, what))

    def _finished(self, task: asyncio.Task[Any], what: str) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            LOG.error("vLLM %s failed: %s", what, task.exception())


def _adapter_rank(folder: str) -> int | None:
    """The rank ``r`` in a PEFT adapter folder's ``adapter_config.json`` (None when unreadable)."""
    try:
        with open(os.path.join(folder, "adapter_config.json"), encoding="utf-8") as handle:
            rank = json.load(handle).get("r")
    except (OSError, ValueError, AttributeError):
        return None
    return int(rank) if isinstance(rank, int) else None
