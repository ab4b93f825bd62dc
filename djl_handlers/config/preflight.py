"""The checks the init call would make, run before any model is loaded.

``djl-handlers check`` runs them so that everything ``serve`` would reject at start-up fails in
``check`` first; ``djl-handlers serve`` runs the same function before starting the worker.

* ``engine`` names an engine our handlers run under (``known_keys.check_engine_value``);
* for one of our entry points: ``ServingConfig`` builds for the handler's engine, with
  ``option.embedded_model`` resolved to the embedded model's folder as the service does;
* a local ``option.model_id`` (starting with ``/``, ``.`` or ``~``) exists; the embedded model's wheel
  is installed when it is used;
* the tensor/pipeline-parallel degrees can split the model (its ``config.json``, when readable:
  ``config.parallel.check_model_split``);
* the model kind (``config.kinds``: ``option.task``, else the model folder) and that the entry point
  serves it;
* warnings for every key that nothing reads (``known_keys.key_warnings``).

Nothing here imports an ML library or converts the embedded model. That ``option.output_formatter``
names a registered formatter is checked by the caller (``cli``), with the formatter registry
(``dialects.registry``), which a config module does not import; ``Preflight.output_formatter`` is the
name to check.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from djl_handlers.config.kinds import check_kind_engine, detect_kind
from djl_handlers.config.known_keys import check_engine_value, key_warnings
from djl_handlers.config.parallel import ModelShape, check_model_split
from djl_handlers.errors import ConfigError

__all__ = ["ENGINE_OF_ENTRY_POINT", "Preflight", "init_options", "preflight"]

ENGINE_OF_ENTRY_POINT: Mapping[str, str] = {
    "djl_handlers.huggingface": "huggingface",
    "djl_handlers.deepspeed": "deepspeed",
    "djl_handlers.tensorrt_llm": "tensorrt_llm",
    "djl_handlers.vllm": "vllm",
}
EMBEDDED_MODELS: tuple[str, ...] = ("smollm2-135m-instruct", "all-minilm-l6-v2", "random-bert-cross-encoder-seed0")


@dataclass
class Preflight:
    """What the checks found: the validated config (our entry points only) and the warnings."""

    serving_config: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    output_formatter: str | None = None  # the configured formatter name, for the caller to check
    model_kind: str | None = None  # config/kinds.py: generation, embedding or rerank


def init_options(options: Mapping[str, str]) -> dict[str, str]:
    """The options as the service sees them: ``embedded_model`` resolved to its folder.

    The folder is where the converted model lives (``djl_handlers.model.embedded``); it is not
    converted here. ``ConfigError`` when the embedded model's wheel is not installed or the
    name is not one we ship.
    """
    props = dict(options)
    name = str(props.get("embedded_model") or "").strip()
    if name and not str(props.get("model_id") or "").strip():
        if name.lower() not in EMBEDDED_MODELS:
            raise ConfigError(f"option.embedded_model={name!r} is invalid; allowed: {', '.join(EMBEDDED_MODELS)}",
                              field="option.embedded_model")
        if name.lower() != EMBEDDED_MODELS[0]:  # the embedder, or the random reranker (model/embedder.py)
            from djl_handlers.model.embedder import pooling_model_target

            props["model_id"] = str(pooling_model_target(name.lower()))
            return props
        from djl_handlers.model.embedded import default_model_dir, gguf_path

        gguf_path()  # raises with the pip install command when the wheel is missing
        props["model_id"] = str(default_model_dir())
    return props


def _check_model_id(model_id: str | None, model_dir: str) -> None:
    """A local path (``/``, ``.``, ``~``) must exist; relative ones are taken from the model directory."""
    if not model_id or not model_id.startswith((".", "/", "~")):
        return
    path = Path(model_id).expanduser()
    if not path.is_absolute():
        path = Path(model_dir) / path
    if not path.exists():
        raise ConfigError(f"option.model_id={model_id!r}: no such folder", field="option.model_id")


def _model_folder(model_id: str, model_dir: str) -> str:
    """The local model folder: ``model_id`` (relative to the model directory), else the model directory."""
    folder = Path(model_id).expanduser() if model_id else Path(model_dir)
    if model_id and not folder.is_absolute():
        folder = Path(model_dir) / folder
    return str(folder)


def _model_shape(model_id: str, model_dir: str) -> ModelShape | None:
    """The shape in the local model folder's ``config.json`` (``model_id``, else the model directory)."""
    folder = Path(_model_folder(model_id, model_dir))
    return ModelShape.from_folder(folder) if folder.is_dir() else None


def preflight(entry_point: str, model_dir: str, options: Mapping[str, str],
              server: Mapping[str, str]) -> Preflight:
    """Run the init-time checks for ``entry_point``; ``ConfigError`` on the first problem."""
    from djl_handlers.config.models import ServingConfig

    check_engine_value(server)
    engine = ENGINE_OF_ENTRY_POINT.get(entry_point)
    result = Preflight(warnings=key_warnings(options, server, engine))
    if engine is None:
        return result
    props = init_options(options)
    config = ServingConfig.from_properties(props, server, engine)
    result.output_formatter = config.output_formatter or None
    _check_model_id(str(options.get("model_id") or "").strip(), model_dir)  # not the embedded folder: serve converts it
    model_id = str(props.get("model_id") or "").strip()
    check_model_split(config.parallel, _model_shape(model_id, model_dir))
    result.model_kind = detect_kind(config.pooling.task, _model_folder(model_id, model_dir))
    check_kind_engine(result.model_kind, config.serving_engine, config.pooling.task)
    result.serving_config = dict(json.loads(json.dumps(dataclasses.asdict(config), default=str)))
    return result
