"""TensorRT-LLM adapter: the synchronous Engine protocol over the asynchronous LLM API.

``tensorrt_llm.LLM`` runs in-flight batching in its own executor; a request is submitted with
``generate_async(prompt_token_ids, sampling_params=SamplingParams(**to_trtllm(params)),
streaming=True)``, which returns a ``RequestOutput`` that yields an updated snapshot of itself
after every engine iteration (``async for``). The adapter owns a private event loop on a daemon
thread; it submits every request there (the LLM API gives a result an async queue only when it
is created inside a running loop) and runs one pump task per request that turns snapshots into
deltas and puts them on a thread-safe queue. ``step()`` returns every delta that is ready,
waiting up to ``poll_timeout_s`` when none is, so the caller's loop keeps its own rhythm.

Deltas → ``StepOutput``: one per new token id, the text delta on the last one (TensorRT-LLM
detokenizes per response). TensorRT-LLM matches stop words on token ids and, unless
``include_stop_str_in_output``, trims them from the final output only; the adapter therefore
holds back ``len(longest stop string) - 1`` characters of an unfinished request (as vLLM does),
so a stop string is never streamed. The end token is not part of ``token_ids``: an EOS finish
arrives as a final response without new tokens, reported as one ``StepOutput`` whose
``token_id`` is the end id (for a trimmed stop word: the stop word's last token id).
Finish reasons: ``length`` → ``length``; ``stop`` with a str ``stop_reason`` → ``stop_sequence``;
other ``stop`` → ``eos_token``; ``cancelled``/``timeout`` → an error for the request; no finish
reason at all (old releases) → v0.27's rule (``eos_token`` when fewer than
``max_tokens`` tokens were generated, else ``length``).

``release(id)`` of an unfinished request calls ``RequestOutput.abort()``.

Beam search (``num_beams``): checked against the engine's ``max_beam_width`` and submitted without
streaming (:mod:`djl_handlers.engines.external.trtllm_beams`); its beams arrive as samples do.

In DJL's async mode the adapter is awaited directly (:class:`~djl_handlers.engines.base.AsyncEngine`):
``generate_async(request)`` calls the LLM API's ``generate_async(..., streaming=True)`` on the
caller's event loop (the one DJL's async worker awaits requests on; the result gets its async
queue there) and ``async for``s over the ``RequestOutput``, turning each snapshot into step
outputs with the same deltas as above; no adapter thread, no polling. ``abort_async(id)`` (async
mode stopped reading: a stop rule of ours, a cancel) and closing the stream early call
``RequestOutput.abort()``. The adapter's own event loop thread starts only for sync mode's
``add_request``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from djl_handlers.config.engines import DTYPE_NAMES
from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.common import (
    fit_kwargs,
    import_engine_library,
    resolve_model,
    tensor_parallel_size,
)
from djl_handlers.engines.external.trtllm_beams import check_trtllm_beams, max_beam_width_of, streams
from djl_handlers.engines.external.trtllm_outputs import (
    Delta,
    Samples,
    Tracker,
    map_finish_reason,
    snapshot_outputs,
    step_outputs,
    trtllm_sample_seed,
)
from djl_handlers.errors import ConfigError, InvalidParameter, PromptTooLong, message_of

__all__ = ["TrtLlmEngine", "llm_kwargs", "map_finish_reason"]

LOG = logging.getLogger(__name__)


@dataclass
class _Request:
    """Caller-side state of one sample of a request (its ``result`` and ``samples`` are the request's)."""

    result: Any = None
    finished: bool = False
    samples: Optional[Samples] = None


def llm_kwargs(config: Any, llmapi: Any) -> dict[str, Any]:
    """``tensorrt_llm.LLM`` keywords from a ServingConfig-like object."""
    dtype = str(getattr(config, "dtype", "auto") or "auto")
    kwargs: dict[str, Any] = {
        "model": resolve_model(config),
        "dtype": DTYPE_NAMES.get(dtype, dtype),
        "tensor_parallel_size": tensor_parallel_size(config),
        "trust_remote_code": bool(getattr(config, "trust_remote_code", False)),
        "max_batch_size": int(getattr(config, "max_rolling_batch_size", 32) or 32),
    }
    if getattr(config, "max_model_len", None):
        kwargs["max_seq_len"] = int(config.max_model_len)
    kwargs.update(_lora_kwargs(config, llmapi))
    if getattr(llmapi, "GuidedDecodingParams", None) is not None:
        kwargs["guided_decoding_backend"] = "xgrammar"  # structured output (guided_* parameters)
    opts = getattr(config, "trtllm", None)
    if opts is None:
        return kwargs
    if opts.max_num_tokens:
        kwargs["max_num_tokens"] = int(opts.max_num_tokens)
    if opts.max_beam_width > 1:  # beam search (num_beams) up to this width; 1, the LLM API's default, has none
        kwargs["max_beam_width"] = int(opts.max_beam_width)
    if opts.max_output_len:
        LOG.warning("option.max_output_len=%s is an engine-build setting the LLM API does not use", opts.max_output_len)
    kv = getattr(llmapi, "KvCacheConfig", None)
    if kv is not None:
        kwargs["kv_cache_config"] = kv(
            free_gpu_memory_fraction=opts.kv_cache_free_gpu_mem_fraction, enable_block_reuse=opts.enable_kv_cache_reuse
        )
    policy = getattr(getattr(llmapi, "CapacitySchedulerPolicy", None), opts.batch_scheduler_policy.upper(), None)
    if policy is not None and getattr(llmapi, "SchedulerConfig", None) is not None:
        kwargs["scheduler_config"] = llmapi.SchedulerConfig(capacity_scheduler_policy=policy)
    return kwargs


def _lora_kwargs(config: Any, llmapi: Any) -> dict[str, Any]:
    """``lora_config=LoraConfig(max_lora_rank, max_loras, max_cpu_loras)`` (TensorRT-LLM 1.x); older
    releases without ``LoraConfig`` take ``enable_lora``/``max_lora_rank``/``max_loras`` keywords."""
    from djl_handlers.engines.external.vllm_config import lora_kwargs

    flat = lora_kwargs(config)
    if not flat:
        return {}
    lora_config = getattr(llmapi, "LoraConfig", None)
    if lora_config is None:
        flat.pop("max_cpu_loras", None)
        return flat
    flat.pop("enable_lora")
    return {"lora_config": lora_config(lora_dir=[], **flat)}


class TrtLlmEngine:
    """The Engine protocol over ``tensorrt_llm.LLM`` (see the module docstring)."""

    name = "tensorrt_llm"
    sample_seed = staticmethod(trtllm_sample_seed)  # every sample (n > 1) draws from the request's seed

    def __init__(
        self, llm: Any, *, max_model_len: int, poll_timeout_s: float = 0.05, submit_timeout_s: float = 60.0
    ) -> None:
        self.llm = llm
        tokenizer = getattr(llm, "tokenizer", None)
        self.tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # TransformersTokenizer wraps HF's
        self.max_model_len = max_model_len
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_token_ids = frozenset([eos]) if isinstance(eos, int) else frozenset(eos or ())
        self.poll_timeout_s = poll_timeout_s
        self.submit_timeout_s = submit_timeout_s
        self._ready: queue.Queue[tuple[int, Delta]] = queue.Queue()
        self._requests: dict[int, _Request] = {}  # by sample id (a request's first sample: its own id)
        self._results: dict[int, Any] = {}  # async mode: request id -> its RequestOutput
        self._async_samples: dict[int, Samples] = {}  # async mode: sample id -> its request's samples
        self.loras: Any = None  # lora/external.py's EngineLoras with option.enable_lora=true
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # sync mode's adapter loop, started on first use
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def from_config(cls, config: Any) -> TrtLlmEngine:
        """Build ``tensorrt_llm.LLM(...)`` from a ServingConfig-like object."""
        trt = import_engine_library("tensorrt_llm", cls.name)
        llmapi = getattr(trt, "llmapi", trt)
        kwargs = llm_kwargs(config, llmapi)
        try:
            llm = trt.LLM(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"TensorRT-LLM rejected the engine options {kwargs}: {exc}", field="engine") from exc
        max_len = getattr(getattr(llm, "args", None), "max_seq_len", None) or kwargs.get("max_seq_len") or 2048
        engine = cls(llm, max_model_len=int(max_len))
        if "lora_config" in kwargs or kwargs.get("enable_lora"):
            from djl_handlers.lora.external import trtllm_loras

            engine.loras = trtllm_loras(llmapi)
        return engine

    # -- Engine protocol ---------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """Submit ``request`` to the LLM API; bad parameters raise ``InvalidParameter``."""
        sampling, samples = self._sampling_params(request)
        inputs: Any = list(request.prompt_ids) if request.prompt_ids else request.prompt
        states = {sid: _Request(samples=samples) for sid in samples.ids}
        self._requests.update(states)
        lora = self._lora(request.adapter) if request.adapter else None
        future = asyncio.run_coroutine_threadsafe(self._submit(inputs, sampling, samples, lora),
                                                  self._adapter_loop())
        try:
            result = future.result(timeout=self.submit_timeout_s)
        except ValueError as exc:
            for sid in states:
                self._requests.pop(sid, None)
            raise PromptTooLong(f"TensorRT-LLM rejected the prompt: {exc}", field="inputs") from exc
        except BaseException:
            for sid in states:
                self._requests.pop(sid, None)
            raise
        for state in states.values():
            state.result = result

    def step(self) -> list[StepOutput]:
        """Every delta that is ready, waiting up to ``poll_timeout_s`` for the first one."""
        outputs: list[StepOutput] = []
        block = self.has_unfinished()
        while True:
            try:
                rid, delta = self._ready.get(timeout=self.poll_timeout_s) if block else self._ready.get_nowait()
            except queue.Empty:
                return outputs
            block = False
            state = self._requests.get(rid)
            if state is None or state.finished:
                continue  # released already, or a late response after the final one
            if delta.finish_reason is not None or delta.error is not None:
                state.finished = True
            outputs.extend(step_outputs(rid, delta))

    def release(self, request_id: int) -> None:
        """Forget the sample (a request's only one: the request); abort the request in TensorRT-LLM
        once every sample of it finished or was let go while it still runs."""
        async_samples = self._async_samples.get(request_id)
        if async_samples is not None:
            async_samples.release(request_id)
        state = self._requests.pop(request_id, None)
        if state is None or state.samples is None:
            return
        if (state.samples.release(request_id) and state.result is not None and not state.result.finished
                and not all(i in state.samples.finished for i in range(len(state.samples.ids)))):
            self._adapter_loop().call_soon_threadsafe(state.result.abort)

    # -- async mode (AsyncEngine protocol) ---------------------------------------------------------
    async def generate_async(self, request: EngineRequest) -> AsyncIterator[list[StepOutput]]:
        """Run ``request`` on the caller's event loop; yields its new step outputs per response."""
        sampling, samples = self._sampling_params(request)
        inputs: Any = list(request.prompt_ids) if request.prompt_ids else request.prompt
        extra = {"lora_request": self._lora(request.adapter)} if request.adapter else {}
        rid = request.request_id
        try:
            result = self.llm.generate_async(inputs, sampling_params=sampling, streaming=streams(sampling), **extra)
        except ValueError as exc:
            raise PromptTooLong(f"TensorRT-LLM rejected the prompt: {exc}", field="inputs") from exc
        self._results[rid] = result
        self._async_samples.update((sid, samples) for sid in samples.ids)
        done = False
        try:
            async for snapshot in result:
                outs = [o for sid, delta in snapshot_outputs(samples, snapshot) for o in step_outputs(sid, delta)]
                done = not samples.live
                if outs:
                    yield outs
                if done:
                    return
        except Exception as exc:  # noqa: BLE001 - the request fails, the engine goes on (as in sync mode)
            done = True
            yield [StepOutput(rid, error=f"TensorRT-LLM request failed: {message_of(exc)}")]
        finally:
            self._results.pop(rid, None)
            for sid in samples.ids:
                self._async_samples.pop(sid, None)
            if not done and not result.finished:
                result.abort()

    async def abort_async(self, request_id: int) -> None:
        """Abort the request in TensorRT-LLM (``RequestOutput.abort()``) unless it finished."""
        result = self._results.pop(request_id, None)
        if result is not None and not result.finished:
            result.abort()

    def load_adapter(self, spec: Any) -> None:
        """Register a LoRA adapter (a ``LoRARequest``; TensorRT-LLM loads it on first use)."""
        self._require_loras().load(spec)

    def unload_adapter(self, name: str) -> None:
        """Unregister a LoRA adapter."""
        if self.loras is not None:
            self.loras.unload(name)

    def _lora(self, name: str) -> Any:
        return self._require_loras().request_for(name)

    def _require_loras(self) -> Any:
        if self.loras is None:
            from djl_handlers.lora.registry import AdapterError

            raise AdapterError("LoRA adapters are not enabled for this model; set option.enable_lora=true",
                               field="option.enable_lora")
        return self.loras

    def has_unfinished(self) -> bool:
        return any(not s.finished for s in self._requests.values())

    def close(self) -> None:
        """Shut the LLM down and stop the adapter's event loop."""
        shutdown = getattr(self.llm, "shutdown", None)
        if callable(shutdown):
            shutdown()
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def _adapter_loop(self) -> asyncio.AbstractEventLoop:
        """Sync mode's private event loop, on a daemon thread started on first use."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="trtllm-adapter-loop", daemon=True)
            self._thread.start()
        return self._loop

    # -- internals ---------------------------------------------------------------------------------
    def _sampling_params(self, request: EngineRequest) -> tuple[Any, Samples]:
        trt = import_engine_library("tensorrt_llm", self.name)
        from djl_handlers.params.translate import to_trtllm

        check_trtllm_beams(request.params, max_beam_width_of(self.llm))
        kwargs = to_trtllm(request.params)
        guided = kwargs.pop("guided_decoding", None)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            kwargs.setdefault("end_id", eos)
        try:
            kwargs = fit_kwargs(trt.SamplingParams, kwargs, "tensorrt_llm")
            if guided is not None:
                kwargs["guided_decoding"] = _guided_params(trt, guided)
            sampling = trt.SamplingParams(**kwargs)
        except (TypeError, ValueError) as exc:
            raise InvalidParameter(f"TensorRT-LLM rejected the parameters: {exc}") from exc
        stops = [] if sampling.include_stop_str_in_output else _as_list(sampling.stop)
        holdback = max((len(s) for s in stops), default=1) - 1
        end_id = sampling.end_id if sampling.end_id is not None else -1
        max_tokens = int(sampling.max_tokens)
        return sampling, Samples.for_request(request, lambda: Tracker(max_tokens, holdback, end_id, self.tokenizer))

    async def _submit(self, inputs: Any, sampling: Any, samples: Samples, lora: Any = None) -> Any:
        extra = {"lora_request": lora} if lora is not None else {}
        result = self.llm.generate_async(inputs, sampling_params=sampling, streaming=streams(sampling), **extra)
        self._adapter_loop().create_task(self._pump(result, samples))
        return result

    async def _pump(self, result: Any, samples: Samples) -> None:
        try:
            async for snapshot in result:
                for sid, delta in snapshot_outputs(samples, snapshot):
                    self._ready.put((sid, delta))
        except Exception as exc:  # noqa: BLE001 - the request fails, the engine goes on
            self._ready.put((samples.ids[0], Delta(error=f"TensorRT-LLM request failed: {message_of(exc)}")))


def _guided_params(trt: Any, guided: dict[str, Any]) -> Any:
    """``GuidedDecodingParams`` of the installed TensorRT-LLM (the LLM is built with
    ``guided_decoding_backend="xgrammar"``); a release without it: ``InvalidParameter``."""
    cls = getattr(getattr(trt, "llmapi", None), "GuidedDecodingParams", None)
    cls = cls or getattr(getattr(trt, "sampling_params", None), "GuidedDecodingParams", None)
    if cls is None:
        version = getattr(trt, "__version__", "")
        raise InvalidParameter(f"structured output is not supported by the installed tensorrt_llm {version}".rstrip(),
                               field="parameters")
    return cls(**guided)


def _as_list(value: Any) -> Sequence[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
