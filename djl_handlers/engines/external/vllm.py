"""vLLM adapter: the Engine protocol over vLLM's synchronous ``LLMEngine``.

vLLM batches, samples, detokenizes and stops on its own, so every ``StepOutput`` carries the
text delta and, on the last one, the LMI finish reason. How vLLM's outputs become step outputs:

- Requests are added as ``{"prompt_token_ids": [...]}`` (the pipeline already tokenized and
  truncated the prompt) under ``request_id=str(EngineRequest.request_id)``, with
  ``vllm.SamplingParams(**to_vllm(params))``. Outputs are ``RequestOutputKind.CUMULATIVE``
  (vLLM's default, available in every release); the adapter keeps, per request, how much text
  and how many token ids it already reported and emits only the difference.
- One ``StepOutput`` per new token id. When one vLLM step yields several tokens for a request
  (speculative decoding), the tokens before the last carry ``text=""`` and the last carries the
  whole text delta: vLLM detokenizes per step, not per token. A request vLLM did not advance in
  this step (waiting for a slot, chunked prefill) gets no ``StepOutput``.
- ``log_prob`` comes from ``CompletionOutput.logprobs`` (``to_vllm`` asks for ``logprobs=1``
  unless told otherwise), else from the change of ``cumulative_logprob``, else None.
- Finish reasons: ``length`` → ``length``; ``stop`` with a str ``stop_reason`` (a stop string)
  → ``stop_sequence``; ``stop`` with ``stop_reason`` None (EOS) or an int (a stop token id) →
  ``eos_token``; ``abort`` → the request fails with an error (a release from our side never
  shows up, because vLLM sends nothing for requests aborted by the caller).
- ``release(id)`` calls ``abort_request([id])`` when vLLM has not finished the request.

``option.rolling_batch=lmi-dist`` is served by this adapter too (``LmiDistEngine``): LMI-Dist is
not on PyPI, its documented parameter set is vLLM's, and the adapter logs which engine serves it.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from djl_handlers.config.engines import DTYPE_NAMES
from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.common import (
    fit_kwargs,
    import_engine_library,
    resolve_model,
    tensor_parallel_size,
    token_logprob,
    vllm_structured_kwargs,
)
from djl_handlers.errors import ConfigError, InvalidParameter, PromptTooLong

LOG = logging.getLogger(__name__)

LMI_DIST_NOTICE = "option.rolling_batch=lmi-dist is served by vLLM (lmi_dist is not installed)"


# -- vLLM specifics --------------------------------------------------------------------------------
def map_finish_reason(finish_reason: Optional[str], stop_reason: Any) -> Optional[str]:
    """vLLM's ``finish_reason``/``stop_reason`` → LMI's (``abort`` stays ``abort``)."""
    if finish_reason is None:
        return None
    if finish_reason == "length":
        return "length"
    if finish_reason == "stop":
        return "stop_sequence" if isinstance(stop_reason, str) else "eos_token"
    if finish_reason == "abort":
        return "abort"
    return "error"


def engine_args_kwargs(config: Any) -> dict[str, Any]:
    """``vllm.EngineArgs`` keywords from a ServingConfig-like object."""
    dtype = str(getattr(config, "dtype", "auto") or "auto")
    kwargs: dict[str, Any] = {
        "model": resolve_model(config),
        "dtype": DTYPE_NAMES.get(dtype, dtype),
        "tensor_parallel_size": tensor_parallel_size(config),
        "max_num_seqs": int(getattr(config, "max_rolling_batch_size", 256) or 256),
        "trust_remote_code": bool(getattr(config, "trust_remote_code", False)),
    }
    if getattr(config, "revision", None):
        kwargs["revision"] = config.revision
    opts = getattr(config, "vllm", None)
    max_model_len = getattr(opts, "max_model_len", None) or getattr(config, "max_model_len", None)
    if max_model_len:
        kwargs["max_model_len"] = int(max_model_len)
    if opts is not None:
        kwargs.update(_vllm_option_kwargs(opts))
    kwargs.update(lora_kwargs(config))
    return kwargs


def lora_kwargs(config: Any) -> dict[str, Any]:
    """``enable_lora``/``max_loras``/``max_lora_rank``/``max_cpu_loras`` from ``config.lora`` (vLLM's
    and TensorRT-LLM's names)."""
    lora = getattr(config, "lora", None)
    if lora is None or not lora.enable_lora:
        return {}
    kwargs: dict[str, Any] = {"enable_lora": True, "max_loras": int(lora.max_loras),
                              "max_lora_rank": int(lora.max_lora_rank)}
    if lora.max_cpu_loras:
        kwargs["max_cpu_loras"] = int(lora.max_cpu_loras)
    return kwargs


def _vllm_option_kwargs(opts: Any) -> dict[str, Any]:
    """The ``config.vllm`` option group (``VllmOptions``) in vLLM's names."""
    kwargs: dict[str, Any] = {
        "enforce_eager": bool(opts.enforce_eager),
        "gpu_memory_utilization": float(opts.gpu_memory_utilization),
        "load_format": opts.load_format or "auto",
    }
    if opts.max_rolling_batch_prefill_tokens:
        kwargs["max_num_batched_tokens"] = int(opts.max_rolling_batch_prefill_tokens)
    if opts.quantize:
        kwargs["quantization"] = opts.quantize
    if opts.enable_lora:  # config.lora (lora_kwargs) is the same options; kept for option groups built alone
        kwargs.update(enable_lora=True, max_loras=int(opts.max_loras), max_lora_rank=int(opts.max_lora_rank))
    return kwargs


def _engine_tokenizer(engine: Any) -> Any:
    """The Hugging Face tokenizer inside a vLLM engine (V1 ``get_tokenizer()``; V0 tokenizer group)."""
    getter = getattr(engine, "get_tokenizer", None)
    tokenizer = getter() if callable(getter) else None
    if tokenizer is None and callable(getattr(engine, "get_tokenizer_group", None)):
        tokenizer = engine.get_tokenizer_group()
    return getattr(tokenizer, "tokenizer", tokenizer)


def _eos_ids(tokenizer: Any) -> frozenset[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos]) if isinstance(eos, int) else frozenset(int(i) for i in eos)


_KV_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass
class _Track:
    """What the adapter already reported for one request."""

    text_len: int = 0
    token_count: int = 0
    cumulative: Optional[float] = 0.0
    finished: bool = False


class VllmEngine:
    """The Engine protocol over ``vllm.LLMEngine`` (see the module docstring)."""

    name = "vllm"

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.tokenizer = _engine_tokenizer(engine)
        model_config = getattr(engine, "model_config", None) or engine.get_model_config()
        self.max_model_len = int(model_config.max_model_len)
        self.eos_token_ids = _eos_ids(self.tokenizer)
        self._tracks: dict[int, _Track] = {}
        self.loras: Any = None  # lora/external.py's EngineLoras with option.enable_lora=true

    @classmethod
    def from_config(cls, config: Any) -> VllmEngine:
        """Build ``LLMEngine.from_engine_args(EngineArgs(...))`` from a ServingConfig-like object."""
        vllm = import_engine_library("vllm", cls.name)
        lmi_dist = cls.name == "lmi-dist" or getattr(config, "params_engine", None) == "lmi-dist"
        if lmi_dist:
            _log_lmi_dist()
        kwargs = fit_kwargs(vllm.EngineArgs, engine_args_kwargs(config), "vllm")
        LOG.info("starting vLLM %s: %s", getattr(vllm, "__version__", "?"), kwargs)
        try:
            engine = vllm.LLMEngine.from_engine_args(vllm.EngineArgs(**kwargs))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"vLLM rejected the engine options {kwargs}: {exc}", field="engine") from exc
        adapter = cls(engine)
        if kwargs.get("enable_lora"):
            from djl_handlers.lora.external import vllm_loras

            adapter.loras = vllm_loras(engine)
        if lmi_dist:
            adapter.name = "lmi-dist (served by vLLM)"
        return adapter

    # -- Engine protocol ---------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """Queue ``request`` in vLLM; bad parameters raise ``InvalidParameter``."""
        vllm = import_engine_library("vllm", self.name)
        from djl_handlers.params.translate import to_vllm

        kwargs = to_vllm(request.params)
        structured = kwargs.pop("structured_outputs", None)
        kwargs = fit_kwargs(vllm.SamplingParams, kwargs, "vllm")
        constraint = request.params.structured_output
        try:
            if structured is not None:
                kwargs.update(vllm_structured_kwargs(vllm, structured))
            sampling = vllm.SamplingParams(**kwargs)
        except (TypeError, ValueError) as exc:
            raise InvalidParameter(f"vLLM rejected the parameters: {exc}") from exc
        prompt: Any = {"prompt_token_ids": list(request.prompt_ids)} if request.prompt_ids else request.prompt
        lora = {"lora_request": self._lora(request.adapter)} if request.adapter else {}
        try:
            self.engine.add_request(str(request.request_id), prompt, sampling, **lora)
        except Exception as exc:
            # vLLM rejects input with ValueError, and since 0.11 also VLLMValidationError (not a ValueError)
            if not isinstance(exc, ValueError) and not type(exc).__name__.endswith("ValidationError"):
                raise
            if constraint is not None and "prompt" not in str(exc).lower():
                message = f"vLLM rejected {constraint.describe()}: {exc}"
                raise InvalidParameter(message, field=constraint.source) from exc
            raise PromptTooLong(f"vLLM rejected the prompt: {exc}", field="inputs") from exc
        self._tracks[request.request_id] = _Track()

    def step(self) -> list[StepOutput]:
        """Run one vLLM step; one ``StepOutput`` per new token of every request that advanced."""
        results: list[StepOutput] = []
        for output in self.engine.step():
            rid = _int_id(output.request_id)
            track = self._tracks.get(rid) if rid is not None else None
            if rid is None or track is None or track.finished or not output.outputs:
                continue
            results.extend(self._convert(rid, track, output))
        return results

    def release(self, request_id: int) -> None:
        """Forget the request; abort it in vLLM if vLLM has not finished it."""
        track = self._tracks.pop(request_id, None)
        if track is not None and not track.finished:
            self.engine.abort_request([str(request_id)])

    def has_unfinished(self) -> bool:
        return any(not t.finished for t in self._tracks.values())

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
        _require_loras(self).load(spec)

    def unload_adapter(self, name: str) -> None:
        """Unregister a LoRA adapter (``remove_lora``)."""
        if self.loras is not None:
            self.loras.unload(name)

    def _lora(self, name: str) -> Any:
        return _require_loras(self).request_for(name)

    # -- conversion --------------------------------------------------------------------------------
    def _convert(self, rid: int, track: _Track, output: Any) -> list[StepOutput]:
        comp = output.outputs[0]
        ids = list(comp.token_ids)
        new_ids = ids[track.token_count :]
        text = comp.text or ""
        delta = text[track.text_len :] if len(text) > track.text_len else ""
        log_probs = self._log_probs(comp, track, new_ids)
        track.token_count, track.text_len = len(ids), max(track.text_len, len(text))
        reason = map_finish_reason(comp.finish_reason, comp.stop_reason)
        if reason is None and output.finished:
            reason = "eos_token"
        if reason is not None:
            track.finished = True
        if reason in ("abort", "error"):
            return [StepOutput(rid, error=f"vLLM ended the request (finish_reason={comp.finish_reason!r})")]
        if not new_ids:
            return [StepOutput(rid, text=delta, finish_reason=reason)] if (delta or reason) else []
        outs = [
            StepOutput(rid, token_id=t, log_prob=lp, text="") for t, lp in zip(new_ids[:-1], log_probs, strict=False)
        ]
        outs.append(StepOutput(rid, token_id=new_ids[-1], log_prob=log_probs[-1], text=delta, finish_reason=reason))
        return outs

    @staticmethod
    def _log_probs(comp: Any, track: _Track, new_ids: Sequence[int]) -> list[Optional[float]]:
        """Per-token log-probs of ``new_ids`` (cumulative outputs: positions from ``token_count``)."""
        entries = comp.logprobs
        start = track.token_count
        if entries is not None and len(entries) >= start + len(new_ids):
            return [token_logprob(entries[start + i], tid) for i, tid in enumerate(new_ids)]
        cumulative = comp.cumulative_logprob
        previous, track.cumulative = track.cumulative, cumulative
        if cumulative is not None and previous is not None and len(new_ids) == 1:
            return [float(cumulative - previous)]
        return [None] * len(new_ids)


class LmiDistEngine(VllmEngine):
    """``option.rolling_batch=lmi-dist``: the LMI-Dist parameter set, served by vLLM."""

    name = "lmi-dist"


def _log_lmi_dist() -> None:
    if importlib.util.find_spec("lmi_dist") is None:
        LOG.warning(LMI_DIST_NOTICE)
    else:
        LOG.warning("option.rolling_batch=lmi-dist is served by vLLM (lmi_dist is installed but not used)")


def _require_loras(engine: Any) -> Any:
    if engine.loras is None:
        from djl_handlers.lora.registry import AdapterError

        raise AdapterError("LoRA adapters are not enabled for this model; set option.enable_lora=true",
                           field="option.enable_lora")
    return engine.loras


def _int_id(request_id: Any) -> Optional[int]:
    try:
        return int(request_id)
    except (TypeError, ValueError):
        return None
