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
import re
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
    processor: Any = None  # a vision-language model's processor (AutoProcessor); None for text models


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
    processor: Any = None
    try:
        if is_vision_model(model_id):  # image-text-to-text: the model's own class and processor
            from transformers import AutoModelForImageTextToText, AutoProcessor

            processor = AutoProcessor.from_pretrained(model_id, **common)
            tokenizer = processor.tokenizer
            model: Any = AutoModelForImageTextToText.from_pretrained(model_id, dtype=dtype, **common, **extra)
        else:
            tokenizer = AutoTokenizer.from_pretrained(model_id, **common)
            model = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype, **common, **extra)
    except (OSError, ValueError) as exc:
        LOG.debug("loading %s failed: %s", model_id, exc)
        raise ConfigError(f"cannot load model {model_id!r}: {short_reason(exc, model_id)}",
                          field="option.model_id") from exc
    device = resolve_device(opts.device)
    if opts.hf.quantize == "dynamic_int8" and device != "cpu":
        raise ConfigError(f"option.quantize=dynamic_int8 runs on the CPU only (the model is on {device!r}): "
                          "set option.device=cpu, or on a GPU choose bitsandbytes8 or a gptq/awq checkpoint",
                          field="option.quantize")
    model.to(device)
    model.eval()
    report: dict[str, str] = {}
    if device == "cpu":
        from djl_handlers.engines.hf.cpu.isa import dtype_advice
        from djl_handlers.engines.hf.cpu.patches import apply

        advice = dtype_advice(str(model.dtype).removeprefix("torch."))
        if advice:
            LOG.warning(advice)
        report = apply(model, opts.hf)
    return LoadedModel(model, tokenizer, report, processor)


def is_vision_model(model_id: str) -> bool:
    """True when the local folder ``model_id`` holds a vision-language model (its config.json says)."""
    return is_vision_config(read_config(model_id))


def is_vision_config(config: dict[str, Any]) -> bool:
    """True when a ``config.json`` (as a dict) describes a vision-language model."""
    return "vision_config" in config or "image_token_index" in config or "image_token_id" in config


def read_config(model_id: str) -> dict[str, Any]:
    """The local folder's ``config.json`` as a dict (empty when it has none)."""
    import json

    try:
        data = json.loads((Path(model_id) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_UNRECOGNIZED = "Unrecognized configuration class"


def short_reason(exc: BaseException, model_id: str) -> str:
    """What failed, in a sentence or two with what to do: transformers' "Unrecognized configuration
    class" error lists every class it could have loaded (hundreds, on one line); that list is only
    in the DEBUG log (``djl-handlers check --verbose`` prints it too)."""
    text = str(exc)
    if not text.startswith(_UNRECOGNIZED):
        return text
    config = text.split("'", 2)[1].rsplit(".", 1)[-1] if "'" in text else "this config"
    model_type, kind = _model_type(model_id)
    hint = {"vision": "it is a vision-language model of a family transformers cannot load as image-text-to-text "
                      "(docs/vision.md lists the families served)",
            "encoder": "it is an encoder model: serve it as an embedder or reranker (option.task, docs/embeddings.md)",
            }.get(kind, "this engine serves text-generation (causal LM) models")
    auto = re.search(r"AutoModel: (\w+)", text)
    loader = auto.group(1) if auto else "AutoModelForCausalLM"
    return (f"its config is {config} (model_type {model_type!r}), which transformers' {loader} "
            f"cannot load: {hint}. The classes it can load are listed in transformers' documentation "
            f"(and by djl-handlers check --verbose)")


def _model_type(model_id: str) -> tuple[str, str]:
    """The folder's ``model_type`` and its kind (``vision``, ``encoder`` or ``other``), from config.json."""
    import json

    try:
        config = json.loads((Path(model_id) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "unknown", "other"
    model_type = str(config.get("model_type", "unknown"))
    if is_vision_config(config):
        return model_type, "vision"
    archs = " ".join(config.get("architectures") or [])
    if model_type in ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "deberta-v2") or (
            "ForSequenceClassification" in archs or archs.endswith("Model")):
        return model_type, "encoder"
    return model_type, "other"


def unloadable_reason(model_id: str) -> tuple[str, str] | None:
    """Why transformers' ``AutoModelForCausalLM`` cannot load the local folder ``model_id``'s config
    (``djl-handlers check`` asks before any weight is read): the short reason :func:`short_reason`
    gives and the full list of configs it can load; None when it can (or when this cannot be told
    without running the folder's own code: ``auto_map``)."""
    path = Path(model_id)
    if not (path / "config.json").is_file() or is_vision_model(str(path)):
        return None  # a vision-language model loads as image-text-to-text
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        return str(exc), str(exc)
    if getattr(config, "auto_map", None) or type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return None
    known = ", ".join(sorted(c.__name__ for c in MODEL_FOR_CAUSAL_LM_MAPPING.keys()))
    full = (f"{_UNRECOGNIZED} <class '{type(config).__module__}.{type(config).__name__}'> for this kind of "
            f"AutoModel: AutoModelForCausalLM. Model type should be one of {known}")
    return short_reason(ValueError(full), str(path)), full
