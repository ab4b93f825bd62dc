"""``ServingConfig``: every model option typed and validated in one place.

Built from the option map DJL's init call sends (``option.*`` keys, prefix stripped) and the
server keys (``batch_size`` ...). A wrong value raises ``ConfigError`` naming the key, the bad
value and what is allowed; ``ConfigError.field`` is the key. Unknown option keys are kept in
``raw`` and are not an error (DJL passes many keys that are not ours). Empty values count as
unset. Booleans accept ``true``/``false``/``1``/``0`` (case-insensitive, blanks trimmed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from djl_handlers.config.chat import ChatOptions, read_chat_options
from djl_handlers.config.engines import DTYPE_NAMES, ENGINES, canonical_engine
from djl_handlers.config.hf import HuggingFaceOptions, read_hf_options
from djl_handlers.config.kinds import PoolingOptions, read_pooling
from djl_handlers.config.media import MediaOptions, read_media_options
from djl_handlers.config.parallel import ParallelOptions, read_parallel
from djl_handlers.config.reader import Reader
from djl_handlers.config.resolve import is_async_value
from djl_handlers.config.sessions import SessionOptions, read_session_options
from djl_handlers.config.speculative import read_speculative_json
from djl_handlers.errors import ConfigError

ROLLING_BATCH: tuple[str, ...] = ("auto", "scheduler", "disable", "lmi-dist", "vllm", "trtllm", "deepspeed")
DTYPES: tuple[str, ...] = tuple(DTYPE_NAMES)
STREAMING: tuple[str, ...] = ("false", "true", "huggingface")

# Which option.rolling_batch values each handler engine accepts (DJL's HF handler hands
# vllm/lmi-dist to vLLM; TRT-LLM and DeepSpeed accept only their own value, auto and disable).
ROLLING_BY_ENGINE: Mapping[str, tuple[str, ...]] = {
    "huggingface": ("auto", "scheduler", "disable", "vllm", "lmi-dist"),
    "deepspeed": ("auto", "deepspeed", "scheduler", "disable"),
    "tensorrt_llm": ("auto", "trtllm", "disable"),
    "vllm": ("auto", "vllm", "lmi-dist"),
    "lmi-dist": ("auto", "lmi-dist", "vllm"),
}
_AUTO_ROLLING: Mapping[str, str] = {
    "huggingface": "scheduler", "deepspeed": "scheduler", "tensorrt_llm": "trtllm",
    "vllm": "vllm", "lmi-dist": "lmi-dist",
}
_DEVICE = re.compile(r"cpu|cuda|cuda:\d+|mps|auto")
# The engines that step with the transformers engine and read its options (config/hf.py).
_HF_FAMILY: tuple[str, ...] = ("huggingface", "deepspeed")


@dataclass(frozen=True)
class DeepSpeedOptions:
    """DeepSpeed inference options (``ds_properties.py`` in DJL)."""

    quantize: str | None = None
    max_tokens: int = 1024
    enable_cuda_graph: bool = False
    triangular_masking: bool = True
    return_tuple: bool = True
    training_mp_size: int = 1
    checkpoint: str | None = None


@dataclass(frozen=True)
class VllmOptions:
    """vLLM engine options (``vllm_rb_properties.py`` in DJL)."""

    max_model_len: int | None = None
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.9
    max_rolling_batch_prefill_tokens: int | None = None
    load_format: str = "auto"
    quantize: str | None = None
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    speculative_config: dict[str, Any] | None = None  # option.speculative_config, to vLLM unchanged
    kv_cache_dtype: str = "auto"  # option.kv_cache_dtype in vLLM's names (fp16/bf16 written out), vLLM checks it


@dataclass(frozen=True)
class TrtLlmOptions:
    """TensorRT-LLM LLM-API options (``trt_properties.py`` in DJL plus the KV-cache knobs)."""

    max_output_len: int | None = None
    max_num_tokens: int | None = None
    kv_cache_free_gpu_mem_fraction: float = 0.9
    enable_kv_cache_reuse: bool = False
    batch_scheduler_policy: str = "max_utilization"
    max_beam_width: int = 1  # LLM(max_beam_width=...): the widest beam search a request may ask for


@dataclass(frozen=True)
class LoraOptions:
    """LoRA adapter options, as LMI documents them (every engine).

    ``max_loras``: distinct adapters in one running batch; ``max_lora_rank``: the largest rank an
    adapter may have; ``max_cpu_loras``: adapters kept loaded at once (default ``max_loras``), at
    least ``max_loras``.
    """

    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    @property
    def cpu_limit(self) -> int:
        """Adapters that may be loaded at once."""
        return self.max_cpu_loras or self.max_loras


def _lora(r: Reader) -> LoraOptions:
    max_loras = r.integer("max_loras", 4, 1) or 4
    max_cpu = r.integer("max_cpu_loras", None, 1)
    if max_cpu is not None and max_cpu < max_loras:
        raise r.fail("option.max_cpu_loras", str(max_cpu), f"an integer >= option.max_loras ({max_loras})")
    return LoraOptions(
        enable_lora=r.boolean("enable_lora", False),
        max_loras=max_loras,
        max_lora_rank=r.integer("max_lora_rank", 16, 1) or 16,
        max_cpu_loras=max_cpu,
    )


def _deepspeed(r: Reader) -> DeepSpeedOptions:
    quantize = r.choice("quantize", "", ("", "smoothquant", "dynamic_int8"))
    return DeepSpeedOptions(
        quantize=quantize or None,
        max_tokens=r.integer("max_tokens", 1024, 1) or 1024,
        enable_cuda_graph=r.boolean("enable_cuda_graph", False),
        triangular_masking=r.boolean("triangular_masking", True),
        return_tuple=r.boolean("return_tuple", True),
        training_mp_size=r.integer("training_mp_size", 1, 1) or 1,
        checkpoint=r.text("checkpoint"),
    )


def _vllm(r: Reader) -> VllmOptions:
    return VllmOptions(
        max_model_len=r.integer("max_model_len", None, 1),
        enforce_eager=r.boolean("enforce_eager", False),
        gpu_memory_utilization=r.number("gpu_memory_utilization", 0.9, 0.0, 1.0),
        max_rolling_batch_prefill_tokens=r.integer("max_rolling_batch_prefill_tokens", None, 1),
        load_format=r.text("load_format", "auto") or "auto",
        quantize=r.text("quantize"),
        enable_lora=r.boolean("enable_lora", False),
        max_loras=r.integer("max_loras", 4, 1) or 4,
        max_lora_rank=r.integer("max_lora_rank", 16, 1) or 16,
        speculative_config=read_speculative_json(r),
        kv_cache_dtype=_vllm_kv_dtype(r.text("kv_cache_dtype", "auto") or "auto"),
    )


def _vllm_kv_dtype(value: str) -> str:
    """``option.kv_cache_dtype`` for vLLM: its own names, the short ones ``option.dtype`` takes written out
    (``fp16`` is ``float16``, ``bf16`` ``bfloat16``); anything else as written, for vLLM to check."""
    word = value.strip()
    return {"fp16": "float16", "bf16": "bfloat16"}.get(word.lower(), word)


def _trtllm(r: Reader) -> TrtLlmOptions:
    policy = r.choice("batch_scheduler_policy", "max_utilization",
                      ("max_utilization", "guaranteed_no_evict"))
    return TrtLlmOptions(
        max_output_len=r.integer("max_output_len", None, 1),
        max_num_tokens=r.integer("max_num_tokens", None, 1),
        kv_cache_free_gpu_mem_fraction=r.number("kv_cache_free_gpu_mem_fraction", 0.9, 0.0, 1.0),
        enable_kv_cache_reuse=r.boolean("enable_kv_cache_reuse", False),
        batch_scheduler_policy=policy,
        max_beam_width=r.integer("max_beam_width", 1, 1) or 1,
    )


def _device(r: Reader) -> tuple[str, int | None]:
    """``option.device`` if given, else ``cuda:<device_id>`` for a device_id >= 0, else cpu.

    A bare ``option.device=cuda`` takes the worker's GPU (``cuda:<device_id>``) when DJL gave it one;
    with device_id -1 (a worker DJL treats as a CPU one, and ``djl-handlers serve``) it stays ``cuda``.
    """
    found = r.get("device")
    device_id = r.integer("device_id", None, -1)
    device = found[1].lower() if found is not None else None
    if found is not None and not _DEVICE.fullmatch(str(device)):
        raise r.fail(*found, "cpu, cuda, cuda:<n>, mps or auto")
    if device in (None, "cuda") and device_id is not None and device_id >= 0:
        return f"cuda:{device_id}", device_id
    return device or "cpu", device_id


def _check_engine(engine: str) -> str:
    name = canonical_engine(engine)
    if name is None:
        raise ConfigError(f"engine={engine!r} is invalid; allowed: {', '.join(ENGINES)}",
                          field="engine")
    return name


def _batching(r: Reader, engine: str) -> dict[str, Any]:
    """Batch-related settings plus the cross-key checks between them.

    The mode follows DJL's Java side (``config.resolve.mode_of``): rolling batch exactly when
    ``option.rolling_batch`` is set and not ``disable``. An unset value means dynamic batching,
    as DJL's front end then never starts a rolling-batch loop; the number of requests in a call
    (``batch_size`` in DJL's ``test_model``) never changes the mode.
    """
    rolling = r.choice("rolling_batch", "disable", ROLLING_BATCH)
    found = r.get("async_mode")
    in_async_mode = found is not None and is_async_value(str(found[1]))  # DJL 0.35+: disable + async
    if rolling not in ROLLING_BY_ENGINE[engine] and not (in_async_mode and rolling == "disable"):
        unset = r.get("rolling_batch") is None
        written = " is unset" if unset else f"={rolling}"
        hint = (" (DJL 0.34 rewrites auto/unset to disable for a model with a config.json unless "
                "SERVING_FEATURES names an engine)") if rolling == "disable" else ""
        raise ConfigError(
            f"option.rolling_batch{written}, but engine {engine} allows only "
            f"{', '.join(ROLLING_BY_ENGINE[engine])}{hint}; set option.rolling_batch explicitly",
            field="option.rolling_batch")
    batch_size = r.integer("batch_size", 1, 1, server=True) or 1
    streaming = r.choice("enable_streaming", "false", STREAMING)
    big = rolling in ("vllm", "lmi-dist") or (rolling == "auto" and engine in ("vllm", "lmi-dist"))
    return {
        "rolling_batch": rolling,
        "async_mode": in_async_mode,
        "batch_size": batch_size,
        "enable_streaming": streaming,
        "max_rolling_batch_size": r.integer("max_rolling_batch_size", 256 if big else 32, 1),
        "max_batch_delay_ms": r.integer("max_batch_delay", 100, 0, server=True),
        "job_queue_size": r.integer("job_queue_size", 1000, 1, server=True),
    }


def _common(r: Reader) -> dict[str, Any]:
    """Model identity, numerics, formatting and limits."""
    device, device_id = _device(r)
    return {
        "model_id": r.text("model_id"),
        "model_dir": r.text("model_dir"),
        "entry_point": r.text("entryPoint"),
        "handler": r.text("handler", "handle") or "handle",
        "revision": r.text("revision"),
        "dtype": r.choice("dtype", "fp32", DTYPES, "data_type"),
        "device": device,
        "device_id": device_id,
        "trust_remote_code": r.boolean("trust_remote_code", False),
        "output_formatter": r.text("output_formatter"),
        "tgi_compat": r.boolean("tgi_compat", False),
        "bedrock_compat": r.boolean("bedrock_compat", False),
        "max_model_len": r.integer("max_model_len", None, 1),
        "max_input_len": r.integer("max_input_len", None, 1),
        "max_new_tokens_limit": r.integer("max_new_tokens_limit", 4096, 1),
        "strict_parameters": r.boolean("strict_parameters", True),
        "predict_timeout_s": r.integer("predict_timeout", 120, 1),
        "model_loading_timeout_s": r.integer("model_loading_timeout", 240, 1),
    }


@dataclass(frozen=True)
class ServingConfig:
    """The validated model configuration. Build it with ``ServingConfig.from_properties``."""

    engine: str = "huggingface"
    model_id: str | None = None
    model_dir: str | None = None
    entry_point: str | None = None
    handler: str = "handle"
    revision: str | None = None
    rolling_batch: str = "disable"
    # DJL's async mode (``option.async_mode``, ``Boolean.parseBoolean``): each request is awaited alone
    async_mode: bool = False
    max_rolling_batch_size: int = 32
    batch_size: int = 1
    max_batch_delay_ms: int = 100
    job_queue_size: int = 1000
    enable_streaming: str = "false"
    dtype: str = "fp32"
    device: str = "cpu"
    device_id: int | None = None
    trust_remote_code: bool = False
    output_formatter: str | None = None
    tgi_compat: bool = False
    bedrock_compat: bool = False
    max_model_len: int | None = None
    max_input_len: int | None = None
    max_new_tokens_limit: int = 4096
    strict_parameters: bool = True
    predict_timeout_s: int = 120
    model_loading_timeout_s: int = 240
    hf: HuggingFaceOptions = field(default_factory=HuggingFaceOptions)
    deepspeed: DeepSpeedOptions = field(default_factory=DeepSpeedOptions)
    vllm: VllmOptions = field(default_factory=VllmOptions)
    trtllm: TrtLlmOptions = field(default_factory=TrtLlmOptions)
    lora: LoraOptions = field(default_factory=LoraOptions)
    parallel: ParallelOptions = field(default_factory=ParallelOptions)
    pooling: PoolingOptions = field(default_factory=PoolingOptions)  # the embedding/rerank kinds (config/kinds.py)
    chat: ChatOptions = field(default_factory=ChatOptions)  # reasoning and tool-call parsers (config/chat.py)
    sessions: SessionOptions = field(default_factory=SessionOptions)  # LMI's stateful sessions (config/sessions.py)
    media: MediaOptions = field(default_factory=MediaOptions)  # images of vision-language models (config/media.py)
    raw: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_properties(
        cls,
        options: Mapping[str, str],
        server: Mapping[str, str] | None = None,
        engine: str = "huggingface",
    ) -> ServingConfig:
        """Validate ``options`` (``option.`` prefix stripped) and ``server`` keys for ``engine``.

        ``engine`` is the handler's engine: one of ``ENGINES`` (``trtllm``/``hf`` accepted).
        Raises ``ConfigError`` on the first invalid value.
        """
        name = _check_engine(engine)
        reader = Reader(options, server or {})
        common = _common(reader)
        return cls(
            engine=name,
            **common,
            **_batching(reader, name),
            hf=read_hf_options(reader, loading=name == "huggingface") if name in _HF_FAMILY else HuggingFaceOptions(),
            deepspeed=_deepspeed(reader) if name == "deepspeed" else DeepSpeedOptions(),
            vllm=_vllm(reader) if name in ("vllm", "lmi-dist") else VllmOptions(),
            trtllm=_trtllm(reader) if name == "tensorrt_llm" else TrtLlmOptions(),
            lora=_lora(reader),
            parallel=read_parallel(reader, common["device"], name),
            pooling=read_pooling(reader),
            chat=read_chat_options(reader, common["model_dir"]),
            sessions=read_session_options(reader),
            media=read_media_options(reader),
            raw={str(k): str(v) for k, v in options.items()},
        )

    def resolved_rolling_batch(self, engine: str | None = None) -> str:
        """The rolling-batch implementation actually used: ``auto`` resolved for ``engine``.

        ``auto`` (set explicitly; DJL's front end already rewrote it where it would) →
        ``scheduler`` for huggingface/deepspeed, ``vllm``, ``lmi-dist``, or ``trtllm``.
        """
        if self.rolling_batch != "auto":
            return self.rolling_batch
        return _AUTO_ROLLING[_check_engine(engine or self.engine)]

    @property
    def tensor_parallel_degree(self) -> int:
        """``option.tensor_parallel_degree`` (-1: every device); ``parallel`` holds all the degrees."""
        return self.parallel.tensor_parallel_degree

    @property
    def params_engine(self) -> str:
        """The engine whose parameter set requests are validated against."""
        rolling = self.resolved_rolling_batch()
        return {"vllm": "vllm", "lmi-dist": "lmi-dist", "trtllm": "tensorrt_llm"}.get(rolling, self.engine)

    @property
    def serving_engine(self) -> str:
        """The engine library that really serves requests (``lmi-dist`` is served by vLLM)."""
        engine = self.params_engine
        return "vllm" if engine == "lmi-dist" else engine

    @property
    def is_rolling(self) -> bool:
        """True unless rolling batch resolves to ``disable`` (dynamic batching)."""
        return self.resolved_rolling_batch() != "disable"
