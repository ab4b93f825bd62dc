"""Load a transformers causal LM and its tokenizer for the HF engine.

Options come from a ``ServingConfig``-like object (attributes or a mapping, with or without the
``option.`` prefix) and/or keyword arguments; keyword arguments win. An empty ``model_id`` means
the embedded default model (converted once into the local cache).

Only the HF engine imports this module; torch and transformers are imported inside functions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from djl_handlers.config.engines import DTYPE_NAMES
from djl_handlers.errors import ConfigError

LOG = logging.getLogger(__name__)

# option.dtype values and torch's own names for them
DTYPES = {**DTYPE_NAMES, **{name: name for name in DTYPE_NAMES.values()}}


@dataclass(frozen=True)
class LoadOptions:
    """What to load and how. ``device``: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""

    model_id: str = ""
    dtype: str = "fp32"
    trust_remote_code: bool = False
    torch_threads: int | None = None
    device: str = "cpu"
    revision: str | None = None
    attn_implementation: str | None = None
    cpu_linear: str = "torch"  # "onednn": prepacked oneDNN linear layers on the CPU (hf_cpu_linear)
    # with cpu_linear=onednn: sibling projections (q/k/v, gate/up) as one GEMM each (hf_cpu_fused)
    cpu_fuse_projections: bool = False
    # "ragged": decode attention over real tokens (hf_ragged_attn; an error if its kernel cannot be
    # built), "auto": ragged when it builds, else sdpa with a warning; "sdpa": torch's
    cpu_attention: str = "sdpa"
    cpu_norm: str = "torch"  # "fused": one-pass RMSNorm kernel on the CPU (hf_cpu_norm), else torch's
    cpu_rotary: str = "torch"  # "fused": one-pass rotary embedding kernel on the CPU (hf_cpu_rotary)

    @classmethod
    def from_config(cls, config: Any = None, **overrides: Any) -> LoadOptions:
        """Read the fields from ``config`` (attributes or mapping keys, ``option.`` optional)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            found = _lookup(config, f.name)
            if found is not None:
                values[f.name] = found
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown model loading option(s): {', '.join(sorted(unknown))}")
        return cls(**values).normalized()

    def normalized(self) -> LoadOptions:
        """Validate and canonicalise (dtype names, booleans given as strings, thread count)."""
        dtype = DTYPES.get(str(self.dtype).strip().lower())
        if dtype is None:
            raise ConfigError(
                f"option.dtype={self.dtype!r} is not supported; use one of fp32, bf16, fp16, auto",
                field="option.dtype",
            )
        threads = self.torch_threads
        if threads is not None:
            try:
                threads = int(threads)
            except (TypeError, ValueError):
                threads = 0
            if threads < 1:
                raise ConfigError(
                    f"torch_threads={self.torch_threads!r} must be a positive integer", field="torch_threads"
                )
        cpu_linear = str(self.cpu_linear or "torch").strip().lower()
        if cpu_linear not in ("onednn", "torch"):
            raise ConfigError(f"option.cpu_linear={self.cpu_linear!r} is not supported; use onednn or torch",
                              field="option.cpu_linear")
        cpu_attention = str(self.cpu_attention or "sdpa").strip().lower()
        if cpu_attention not in ("auto", "ragged", "sdpa"):
            raise ConfigError(f"option.cpu_attention={self.cpu_attention!r} is not supported; use auto, ragged or sdpa",
                              field="option.cpu_attention")
        cpu_norm = str(self.cpu_norm or "torch").strip().lower()
        if cpu_norm not in ("fused", "torch"):
            raise ConfigError(f"option.cpu_norm={self.cpu_norm!r} is not supported; use fused or torch",
                              field="option.cpu_norm")
        cpu_rotary = str(self.cpu_rotary or "torch").strip().lower()
        if cpu_rotary not in ("fused", "torch"):
            raise ConfigError(f"option.cpu_rotary={self.cpu_rotary!r} is not supported; use fused or torch",
                              field="option.cpu_rotary")
        return replace(
            self,
            model_id=str(self.model_id or ""),
            cpu_linear=cpu_linear,
            cpu_attention=cpu_attention,
            cpu_norm=cpu_norm,
            cpu_rotary=cpu_rotary,
            cpu_fuse_projections=_as_bool(self.cpu_fuse_projections, "option.cpu_fuse_projections"),
            dtype=dtype,
            trust_remote_code=_as_bool(self.trust_remote_code, "option.trust_remote_code"),
            torch_threads=threads,
            device=str(self.device or "cpu"),
        )


def _lookup(config: Any, name: str) -> Any:
    if config is None:
        return None
    for key in (name, f"option.{name}"):
        if isinstance(config, Mapping):
            if key in config:
                return config[key]
        elif hasattr(config, key):
            return getattr(config, key)
    return None


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ConfigError(f"{key}={value!r} is not a boolean (true/false)", field=key)


def resolve_model_id(model_id: str) -> str:
    """An empty id means the embedded default model; a local path must exist."""
    if not model_id:
        from djl_handlers.model.embedded import embedded_model_dir

        return str(embedded_model_dir())
    path = Path(model_id).expanduser()
    if model_id.startswith((".", "/", "~")) and not path.exists():
        raise ConfigError(f"option.model_id={model_id!r}: no such folder", field="option.model_id")
    return str(path) if path.exists() else model_id


def set_torch_threads(threads: int | None) -> None:
    """Cap torch's intra-op threads (None: leave torch's default, or ``OMP_NUM_THREADS``)."""
    import torch

    if threads is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = int(os.environ["OMP_NUM_THREADS"])
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def resolve_device(device: str) -> str:
    """``auto`` picks ``cuda`` when available, else ``cpu``."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} requested but CUDA is not available", field="device")
    return device


def load_model_and_tokenizer(options: LoadOptions) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` in eval mode on the requested device and dtype.

    Raises:
        ConfigError: the model cannot be found or loaded (message names the model id).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    opts = options.normalized()
    set_torch_threads(opts.torch_threads)
    model_id = resolve_model_id(opts.model_id)
    # local_files_only: nothing is ever downloaded from a model hub at run time.
    common = {"trust_remote_code": opts.trust_remote_code, "revision": opts.revision, "local_files_only": True}
    dtype: Any = opts.dtype
    if dtype == "auto":  # per device: see hf_dtype
        from djl_handlers.engines.hf_dtype import checkpoint_dtype, resolve_auto

        dtype = resolve_auto(str(resolve_device(opts.device)), checkpoint_dtype(model_id, **common))
    dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    extra = {"attn_implementation": opts.attn_implementation} if opts.attn_implementation else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id, **common)
        model: Any = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype, **common, **extra)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load model {model_id!r}: {exc}", field="option.model_id") from exc
    device = resolve_device(opts.device)
    model.to(device)
    model.eval()
    if opts.cpu_linear == "onednn" and device == "cpu":
        from djl_handlers.engines.hf_cpu_linear import prepack_linears

        prepack_linears(model)
        if opts.cpu_fuse_projections:
            from djl_handlers.engines.hf_cpu_fused import fuse_projections

            fuse_projections(model)  # checked against the unfused forward; logs and keeps them apart if not
    if opts.cpu_norm == "fused" and device == "cpu":
        from djl_handlers.engines.hf_cpu_norm import fuse_rms_norms

        fuse_rms_norms(model)  # logs and keeps torch's when the kernel cannot be built
    if opts.cpu_rotary == "fused" and device == "cpu":
        from djl_handlers.engines.hf_cpu_rotary import enable as enable_rotary

        enable_rotary(model)  # bitwise torch's; logs and keeps torch's when the kernel cannot be built
    if opts.cpu_attention != "sdpa" and device == "cpu":
        use_ragged_attention(model, required=opts.cpu_attention == "ragged")
    return model, tokenizer


def use_ragged_attention(model: Any, required: bool) -> None:
    """Switch a CPU model on SDPA to the ragged decode attention (``option.cpu_attention``); when
    its kernel cannot be built, raise if ``required``, else warn and keep SDPA."""
    from djl_handlers.engines.hf_ragged_attn import enable
    from djl_handlers.kernels.decode_attention import unavailable_reason

    if enable(model):
        LOG.info("option.cpu_attention: decode steps attend over real tokens only (ragged kernel)")
        return
    why = unavailable_reason()
    if why is None:  # built, but the model does not use SDPA (eager, flash, ...): its choice stands
        LOG.info("option.cpu_attention: the model uses %r attention, not sdpa; kept",
                 model.config._attn_implementation)
        return
    if required:
        raise ConfigError(f"option.cpu_attention=ragged needs its C kernel, which cannot be built here: {why}",
                          field="option.cpu_attention")
    LOG.warning("decode attention stays on torch's SDPA: the ragged kernel cannot be built here (%s)", why)
