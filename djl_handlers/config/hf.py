"""The transformers (HF) engine's options, typed once with their defaults: loading (DJL's
``hf_properties``), the continuous-batching step, and the CPU kernel patches.

The loading keys are read for ``djl_handlers.huggingface`` only (DeepSpeed has its own
``quantize``); the step and CPU keys also for ``djl_handlers.deepspeed``, which steps with the HF
engine. The engine, its loader and its CPU patches read these typed values, never the raw options.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from djl_handlers.config.reader import Reader
from djl_handlers.config.speculative import NgramOptions, read_ngram
from djl_handlers.errors import ConfigError

__all__ = ["DEFAULT_PREFILL_TOKENS", "HuggingFaceOptions", "parse_bytes", "read_hf_options"]

# Prompt tokens (padded) prefilled per step unless ``option.max_prefill_tokens`` says otherwise: vLLM's
# CPU default for its API server. Against 512 (the default before) it admits a burst of prompts in a
# quarter of the steps, so fewer decode forwards run beside the prefill and the later decode steps run
# at full batch: 1.31x tok/s (median of 4 alternated rounds, bf16) on the benchmark workload
# (docs/benchmarks.md, "What the defaults rest on"). A smaller value lowers the inter-token-latency spike
# of a prefill step.
DEFAULT_PREFILL_TOKENS = 2048

# dynamic_int8: int8 weights quantized at load, on the CPU (engines/hf/cpu/int8.py; LMI DeepSpeed's name)
QUANTIZE: tuple[str, ...] = ("bitsandbytes4", "bitsandbytes8", "gptq", "awq", "dynamic_int8")
ATTN_IMPLEMENTATIONS: tuple[str, ...] = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
CPU_LINEAR: tuple[str, ...] = ("auto", "mkl", "onednn", "torch")
CPU_ATTENTION: tuple[str, ...] = ("auto", "ragged", "sdpa")
CPU_FUSED: tuple[str, ...] = ("fused", "torch")  # option.cpu_norm and option.cpu_rotary
CPU_THREADS: tuple[str, ...] = ("adaptive", "fixed")
DECODE_GRAPHS: tuple[str, ...] = ("auto", "cuda_graphs", "compile", "static", "off")
# ``option.kv_cache_dtype`` in vLLM's names (and the short ones ``option.dtype`` takes): the KV cache's
# element type; "auto" is the model's dtype (engines/hf/kv_dtype.py says where a 16-bit one applies)
KV_CACHE_DTYPES: dict[str, str] = {"auto": "auto", "float16": "float16", "fp16": "float16",
                                   "bfloat16": "bfloat16", "bf16": "bfloat16"}
# Size suffixes of ``option.kv_cache_memory_bytes``, as vLLM's ``--kv-cache-memory-bytes`` reads them:
# lower case decimal (1k = 1000), upper case binary (1K = 1024).
_SIZE_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class HuggingFaceOptions:
    """The HF engine's options (see the module docstring for which engine reads which)."""

    # loading: transformers/accelerate (``hf_properties.py`` in DJL)
    low_cpu_mem_usage: bool = False
    device_map: str | None = None
    attn_implementation: str | None = None
    quantize: str | None = None
    # the step
    # padded prompt tokens prefilled per step; None: the device's default (engines/hf/prefill_budget.py:
    # DEFAULT_PREFILL_TOKENS on a CPU, more on a large GPU)
    max_prefill_tokens: int | None = None
    torch_threads: int | None = None  # torch's intra-op threads (None: OMP_NUM_THREADS or torch's default)
    cpu_threads: str = "adaptive"  # fewer torch threads while other processes hold the cores; or "fixed"
    # prefix caching (engines/hf/prefix_cache.py): prompt KV reused across requests, in blocks, LRU-bounded
    enable_prefix_caching: bool = False
    prefix_cache_memory_bytes: int = 1 << 30
    # KV-cache bound in bytes (vLLM's ``kv_cache_memory_bytes``): None: auto (half the memory free after
    # loading); 0: no bound. A request waits until its worst case fits (engines/hf/kv_budget.py).
    kv_cache_memory_bytes: int | None = None
    # the KV cache's element type (vLLM's ``kv_cache_dtype``): "auto" (the model's), "float16" or "bfloat16"
    kv_cache_dtype: str = "auto"
    # option.speculative_config (vLLM's JSON, method "ngram" only): prompt-lookup speculation, None: off
    # (engines/hf/speculative.py)
    speculative: NgramOptions | None = None
    # CPU kernel patches (engines/hf/cpu/), each applied only to a model on the CPU
    # prepacked linear layers: "auto" (fp32 GEMMs on MKL's packed sgemm where it measures faster than
    # oneDNN's, else oneDNN), "mkl" (MKL wherever it runs), "onednn"; "torch": torch's own
    cpu_linear: str = "auto"
    cpu_fuse_projections: bool = True  # with prepacked layers: q/k/v and gate/up as one GEMM each
    cpu_attention: str = "auto"  # ragged decode attention when its kernel builds; "ragged": or fail; "sdpa"
    cpu_norm: str = "fused"  # one-pass RMSNorm kernel (bitwise torch's); "torch"
    cpu_rotary: str = "fused"  # rotary embedding in one C call (bitwise torch's); "torch"
    # the decode step on static shapes (engines/hf/decode_graphs.py): "auto" (off on every device until
    # graph replay is checked on a GPU), "cuda_graphs", "compile", "static" (the bucketed step run
    # eagerly) or "off"; enforce_eager (vLLM's name) turns it off; cudagraph_capture_sizes: the row
    # buckets (None: 1, 2, 4, multiples of 8)
    decode_graphs: str = "auto"
    enforce_eager: bool = False
    cudagraph_capture_sizes: tuple[int, ...] | None = None


def _check_step(r: Reader) -> None:
    """``option.hf_step``: ``padded`` is the only step; the ``packed`` step was removed."""
    found = r.get("hf_step")
    if found is None or found[1].lower() == "padded":
        return
    label, value = found
    if value.lower() == "packed":
        raise ConfigError(f"{label}={value!r} was removed: the packed step measured slower than the padded one "
                          "on CPU and GPU (docs/engines.md); drop the key or set padded", field=label)
    raise r.fail(label, value, "padded")


def parse_bytes(text: str) -> int | None:
    """A byte count: digits, or a number with one suffix of ``_SIZE_SUFFIX`` (``2G``, ``1.5g``,
    ``512M``); None when ``text`` is neither."""
    match = re.fullmatch(r"(\d{1,18})|(\d{1,12}(?:\.\d{1,6})?)([kKmMgGtT])", text.strip())
    if match is None:
        return None
    if match.group(1) is not None:
        return int(match.group(1))
    return int(float(match.group(2)) * _SIZE_SUFFIX[match.group(3)])


def _kv_bytes(r: Reader) -> int | None:
    """``option.kv_cache_memory_bytes``: ``auto`` (None), ``0`` (no bound) or a byte count."""
    found = r.get("kv_cache_memory_bytes")
    if found is None or found[1].lower() == "auto":
        return None
    value = parse_bytes(found[1])
    if value is None:
        raise r.fail(*found, "auto, 0 (no bound) or a byte count such as 4000000000, 4g (10^9) or 4G (2^30)")
    return value


def _kv_dtype(r: Reader) -> str:
    """``option.kv_cache_dtype``: ``auto``, ``float16``/``fp16`` or ``bfloat16``/``bf16`` (vLLM's fp8
    kinds are refused by name: this engine keeps no scales)."""
    found = r.get("kv_cache_dtype")
    if found is None:
        return "auto"
    word = found[1].strip().lower()
    if word.startswith("fp8"):
        raise ConfigError(f"{found[0]}={found[1]!r}: the transformers engine keeps its KV cache in 16 or 32 bits "
                          "(auto, float16, bfloat16); fp8 KV caches are vLLM's (option.rolling_batch=vllm)",
                          field=found[0])
    if word not in KV_CACHE_DTYPES:
        raise r.fail(*found, "auto, float16 (fp16) or bfloat16 (bf16)")
    return KV_CACHE_DTYPES[word]


def _capture_sizes(r: Reader) -> tuple[int, ...] | None:
    """``option.cudagraph_capture_sizes``: row counts, comma-separated (``1,2,4,8``; brackets allowed,
    as vLLM's list is written), each at least 1; None when unset."""
    found = r.get("cudagraph_capture_sizes")
    if found is None:
        return None
    items = [item.strip() for item in found[1].strip().strip("[]").split(",") if item.strip()]
    if not items or not all(item.isdigit() and int(item) >= 1 for item in items):
        raise r.fail(*found, "row counts separated by commas, each at least 1, such as 1,2,4,8,16")
    return tuple(sorted({int(item) for item in items}))


def read_hf_options(r: Reader, loading: bool = True) -> HuggingFaceOptions:
    """The HF engine's options from ``r``; the loading keys only with ``loading`` (else their defaults)."""
    _check_step(r)
    defaults = HuggingFaceOptions()
    step = HuggingFaceOptions(
        max_prefill_tokens=r.integer("max_prefill_tokens", None, 1),
        torch_threads=r.integer("torch_threads", None, 1),
        cpu_threads=r.choice("cpu_threads", defaults.cpu_threads, CPU_THREADS),
        enable_prefix_caching=r.boolean("enable_prefix_caching", defaults.enable_prefix_caching),
        prefix_cache_memory_bytes=r.integer("prefix_cache_memory_bytes", defaults.prefix_cache_memory_bytes, 0)
        or 0,
        kv_cache_memory_bytes=_kv_bytes(r),
        kv_cache_dtype=_kv_dtype(r),
        speculative=read_ngram(r),
        cpu_linear=r.choice("cpu_linear", defaults.cpu_linear, CPU_LINEAR),
        cpu_fuse_projections=r.boolean("cpu_fuse_projections", defaults.cpu_fuse_projections),
        cpu_attention=r.choice("cpu_attention", defaults.cpu_attention, CPU_ATTENTION),
        cpu_norm=r.choice("cpu_norm", defaults.cpu_norm, CPU_FUSED),
        cpu_rotary=r.choice("cpu_rotary", defaults.cpu_rotary, CPU_FUSED),
        decode_graphs=r.choice("decode_graphs", defaults.decode_graphs, DECODE_GRAPHS),
        enforce_eager=r.boolean("enforce_eager", defaults.enforce_eager),
        cudagraph_capture_sizes=_capture_sizes(r),
    )
    if not loading:
        return step
    quantize = r.choice("quantize", "", ("", *QUANTIZE))
    attn = r.choice("attn_implementation", "", ("", *ATTN_IMPLEMENTATIONS))
    return replace(
        step,
        low_cpu_mem_usage=r.boolean("low_cpu_mem_usage", False),
        device_map=r.text("device_map"),
        attn_implementation=attn or None,
        quantize=quantize or None,
    )
