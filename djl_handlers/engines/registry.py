"""Engine registry: engine name → engine class, imported lazily.

Nothing here imports an ML library at import time. ``load_engine_class(name)`` first checks that
the engine's libraries are importable (``importlib.util.find_spec``, which does not run them)
and raises ``EngineNotInstalled`` with the pip extra to install, without a traceback chain; then
it imports the adapter module. Every engine class has ``from_config(config) -> Engine``, where
``config`` is a ``ServingConfig``-like object (``model_id``, ``dtype``,
``tensor_parallel_degree``, ``max_rolling_batch_size``, ``trust_remote_code``, ``raw``; the
adapters also read their typed option group such as ``config.vllm`` when present).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Mapping

from djl_handlers.config.engines import canonical_engine
from djl_handlers.engines.base import EngineClass
from djl_handlers.errors import ConfigError, EngineNotInstalled

LOG = logging.getLogger(__name__)

# One class per engine of ``djl_handlers.config.engines.ENGINES`` (aliases resolved there), plus
# the deterministic fake engine.
ENGINES: Mapping[str, str] = {
    "huggingface": "djl_handlers.engines.hf.engine:HFEngine",
    "deepspeed": "djl_handlers.engines.external.deepspeed:DeepSpeedEngine",
    "vllm": "djl_handlers.engines.external.vllm:VllmEngine",
    # LMI-Dist is not on PyPI: its parameter set is served by the vLLM adapter (it logs so).
    "lmi-dist": "djl_handlers.engines.external.vllm:LmiDistEngine",
    "tensorrt_llm": "djl_handlers.engines.external.trtllm:TrtLlmEngine",
    "fake": "djl_handlers.engines.fake:FakeEngine",
}
# Top-level modules each engine needs, the first being the one named in messages.
REQUIRED_MODULES: Mapping[str, tuple[str, ...]] = {
    "huggingface": ("torch", "transformers"),
    "deepspeed": ("deepspeed", "torch", "transformers"),
    "vllm": ("vllm",),
    "lmi-dist": ("vllm",),
    "tensorrt_llm": ("tensorrt_llm",),
    "fake": (),
}

# setup.py extra that installs each engine's libraries.
PIP_EXTRAS: Mapping[str, str] = {
    "huggingface": "hf",
    "deepspeed": "deepspeed",
    "vllm": "vllm",
    "lmi-dist": "vllm",
    "tensorrt_llm": "trtllm",
}


def canonical_name(name: str) -> str:
    """The registry key for ``name`` (aliases such as ``trtllm`` resolved); ``ConfigError`` if unknown."""
    key = canonical_engine(name, frozenset(ENGINES))
    if key is None:
        raise ConfigError(f"engine {name!r} is unknown; known engines: {', '.join(sorted(ENGINES))}", field="engine")
    return key


def required_module(name: str) -> str | None:
    """The main Python module the engine needs (``vllm`` for ``lmi-dist``); None for the fake."""
    modules = REQUIRED_MODULES[canonical_name(name)]
    return modules[0] if modules else None


def not_installed(name: str, module: str) -> EngineNotInstalled:
    """The error for engine ``name`` whose library ``module`` cannot be imported."""
    key = canonical_name(name)
    extra = PIP_EXTRAS.get(key, key)
    return EngineNotInstalled(
        f"engine '{name}' needs the {module} package: pip install djl_handlers[{extra}]", field="engine"
    )


def missing_module(name: str) -> str | None:
    """The first required module of engine ``name`` that is not importable, or None."""
    for module in REQUIRED_MODULES[canonical_name(name)]:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ImportError, ValueError):  # a broken or half-installed package
            return module
    return None


def translate_import_error(name: str, exc: ImportError) -> EngineNotInstalled | None:
    """``EngineNotInstalled`` when ``exc`` is about one of engine ``name``'s libraries, else None
    (an ImportError from our own code is a bug and must propagate unchanged)."""
    top = (exc.name or "").split(".")[0]
    if top and top in REQUIRED_MODULES[canonical_name(name)]:
        return not_installed(name, top)
    return None


def load_engine_class(name: str) -> EngineClass:
    """Import and return the engine class registered under ``name`` (aliases accepted).

    Raises ``ConfigError`` for an unknown name and ``EngineNotInstalled`` (no chained traceback)
    when one of the engine's libraries is missing.
    """
    key = canonical_name(name)
    missing = missing_module(key)
    if missing is not None:
        raise not_installed(name, missing)
    module_name, _, attr = ENGINES[key].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        err = translate_import_error(key, exc)
        if err is None:
            raise
        raise err from None
    cls: EngineClass = getattr(module, attr)
    LOG.debug("engine %r resolved to %s", name, ENGINES[key])
    return cls
