"""Load a transformers causal LM and its tokenizer for the HF engine.

What to load comes from a validated ``ServingConfig`` (:class:`LoadOptions` only copies it: the
options, their checks and defaults live in ``djl_handlers.config``). An empty ``model_id`` means
the embedded default model (converted once into the local cache). A model on the CPU gets the CPU
kernel patches its options choose (:mod:`djl_handlers.engines.hf.cpu.patches`).

Only the HF engine family imports this module; torch and transformers are imported inside functions.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from djl_handlers.config.engines import DTYPE_NAMES
from djl_handlers.config.hf import HuggingFaceOptions
from djl_handlers.errors import ConfigError

if TYPE_CHECKING:
    from djl_handlers.config.models import ServingConfig

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    """What to load and how. ``dtype``: torch's name (``float32``, ``bfloat16``, ``float16``) or
    ``auto``; ``device``: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``auto``."""

    model_id: str
    dtype: str
    device: str
    revision: str | None
    trust_remote_code: bool
    hf: HuggingFaceOptions  # attn_implementation, torch_threads and the CPU patches

    @classmethod
    def from_config(cls, config: ServingConfig) -> LoadOptions:
        """The options ``config`` gives (already validated there)."""
        return cls(model_id=config.model_id or "", dtype=DTYPE_NAMES[config.dtype], device=config.device,
                   revision=config.revision, trust_remote_code=config.trust_remote_code, hf=config.hf)


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


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model, its tokenizer, and what each CPU kernel patch did to it (one line per patch of
    :data:`~djl_handlers.engines.hf.cpu.patches.PATCHES`; empty off the CPU)."""

    model: Any
    tokenizer: Any
    cpu_patches: dict[str, str]


def load_model_and_tokenizer(opts: LoadOptions) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` in eval mode on the requested device and dtype (:func:`load_model`)."""
    loaded = load_model(opts)
    return loaded.model, loaded.tokenizer


def load_model(opts: LoadOptions) -> LoadedModel:
    """Load the model and tokenizer in eval mode on the requested device and dtype; a model on the
    CPU gets the kernel patches its options choose, and the result says which applied.

    Raises:
        ConfigError: the model cannot be found or loaded (message names the model id).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    set_torch_threads(opts.hf.torch_threads)
    model_id = resolve_model_id(opts.model_id)
    # local_files_only: nothing is ever downloaded from a model hub at run time.
    common = {"trust_remote_code": opts.trust_remote_code, "revision": opts.revision, "local_files_only": True}
    dtype: Any = opts.dtype
    if dtype == "auto":  # per device: see engines/hf/dtype.py
        from djl_handlers.engines.hf.dtype import checkpoint_dtype, resolve_auto

        dtype = resolve_auto(str(resolve_device(opts.device)), checkpoint_dtype(model_id, **common))
    dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    attn = opts.hf.attn_implementation
    extra = {"attn_implementation": attn} if attn else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id, **common)
        model: Any = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype, **common, **extra)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load model {model_id!r}: {exc}", field="option.model_id") from exc
    device = resolve_device(opts.device)
    model.to(device)
    model.eval()
    report: dict[str, str] = {}
    if device == "cpu":
        from djl_handlers.engines.hf.cpu.patches import apply

        report = apply(model, opts.hf)
    return LoadedModel(model, tokenizer, report)
