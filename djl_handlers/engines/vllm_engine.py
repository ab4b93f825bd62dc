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

import dataclasses
import importlib.util
import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.errors import ConfigError, InvalidParameter, PromptTooLong

LOG = logging.getLogger(__name__)

DTYPES: Mapping[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "auto": "auto"}
LMI_DIST_NOTICE = "option.rolling_batch=lmi-dist is served by vLLM (lmi_dist is not installed)"


# -- helpers shared with the TensorRT-LLM adapter ------------------------------------------------
def import_engine_library(module: str, engine: str) -> Any:
    """Import ``module`` or raise ``EngineNotInstalled`` naming the pip extra (no traceback chain)."""
    import importlib

    from djl_handlers.engines.registry import not_installed, translate_import_error

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        err = translate_import_error(engine, exc) or not_installed(engine, module)
        raise err from None


def accepted_fields(cls: type) -> frozenset[str]:
    """Keyword names the constructor of ``cls`` accepts (msgspec Struct, dataclass or plain class)."""
    names = getattr(cls, "__struct_fields__", None)
    if names is None and dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls) if f.init]
    if names is None:
        params = inspect.signature(cls).parameters.values()
        names = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return frozenset(n for n in names if not n.startswith("_"))


def fit_kwargs(cls: type, kwargs: Mapping[str, Any], engine: str) -> dict[str, Any]:
    """``kwargs`` restricted to what the installed ``cls`` accepts.

    A key the installed library does not know is dropped when its value asks for nothing
    (None, 0, False, empty); otherwise the request is rejected with ``InvalidParameter``, so an
    option the user set is never silently ignored.
    """
    known = accepted_fields(cls)
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in known:
            out[key] = value
        elif value not in (None, 0, False, "", [], ()):
            version = getattr(inspect.getmodule(cls), "__version__", "") or ""
            raise InvalidParameter(
                f"{key}={value!r} is not supported by the installed {engine} {version}".rstrip(), field=key
            )
    return out


def vllm_structured_kwargs(vllm: Any, structured: Mapping[str, Any]) -> dict[str, Any]:
    """``SamplingParams`` keywords for a structured-output constraint in the installed vLLM:
    ``structured_outputs=StructuredOutputsParams(...)`` (0.11+) or
    ``guided_decoding=GuidedDecodingParams(...)`` (0.6-0.10); neither: ``InvalidParameter``."""
    module = getattr(vllm, "sampling_params", None)
    fields = accepted_fields(vllm.SamplingParams)
    choices = (("structured_outputs", "StructuredOutputsParams"), ("guided_decoding", "GuidedDecodingParams"))
    for keyword, cls_name in choices:
        cls = getattr(module, cls_name, None) or getattr(vllm, cls_name, None)
        if keyword in fields and cls is not None:
            return {keyword: cls(**structured)}
    version = getattr(vllm, "__version__", "")
    raise InvalidParameter(f"structured output is not supported by the installed vLLM {version}".rstrip(),
                           field="parameters")


def token_logprob(entry: Any, token_id: int) -> Optional[float]:
    """The log-prob of ``token_id`` in one position's logprobs entry (a dict of id → Logprob, or
    a float in older TensorRT-LLM releases)."""
    if entry is None:
        return None
    if isinstance(entry, (int, float)):
        return float(entry)
    value = entry.get(token_id) if hasattr(entry, "get") else None
    if value is None:
        return None
    return float(getattr(value, "logprob", value))


def resolve_model(config: Any) -> str:
    """Model id or folder from the config; empty means the embedded default model."""
    from djl_handlers.engines.hf_loader import resolve_model_id

    return resolve_model_id(getattr(config, "model_id", None) or getattr(config, "model_dir", None) or "")


def tensor_parallel_size(config: Any) -> int:
    """``tensor_parallel_degree`` with -1 ("all devices") resolved to the CUDA device count."""
    degree = int(getattr(config, "tensor_parallel_degree", 1) or 1)
    if degree != -1:
        return degree
    import torch

    return max(1, torch.cuda.device_count())


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
        "dtype": DTYPES.get(dtype, dtype),
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
    if opts.enable_lora:
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
        try:
            self.engine.add_request(str(request.request_id), prompt, sampling)
        except ValueError as exc:
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


def _int_id(request_id: Any) -> Optional[int]:
    try:
        return int(request_id)
    except (TypeError, ValueError):
        return None
