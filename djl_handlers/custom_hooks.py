"""Custom pre/post-processing from the model directory's ``model.py``.

A ``model.py`` may define an input formatter (``(item, **kwargs) -> dict`` returning an LMI
request body) and/or an output formatter (``(out: RequestOutput) -> str``, called once per
step). Mark them with the decorators below, or name the functions ``input_formatter`` /
``output_formatter``. ``model.py`` is the operator's own code and is trusted.

Such a ``model.py`` needs no ``handle`` function and no ``option.entryPoint``: as in DJL 0.34, the
worker then runs the recommended handler (``config.properties.recommended_entry_point``, e.g.
``djl_handlers.huggingface`` when ``option.model_id`` is set), whose service loads these hooks.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, TypeVar

LOG = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def input_formatter(fn: F) -> F:
    """Mark ``fn`` as the input formatter: ``fn(item, **kwargs) -> {"inputs", "parameters", ...}``."""
    fn.is_input_formatter = True  # type: ignore[attr-defined]
    return fn


def output_formatter(fn: F) -> F:
    """Mark ``fn`` as the output formatter: ``fn(out: RequestOutput) -> str`` per step.

    Set ``fn.content_type`` to choose the response Content-Type (default application/json).
    """
    fn.is_output_formatter = True  # type: ignore[attr-defined]
    return fn


@dataclass(frozen=True)
class CustomHooks:
    """The formatters found in model.py (None when absent)."""

    input_formatter: Optional[Callable[..., Any]] = None
    output_formatter: Optional[Callable[..., Any]] = None


def load_hooks(model_dir: Optional[str]) -> CustomHooks:
    """Import ``<model_dir>/model.py`` (reusing an already imported copy) and collect its hooks."""
    if not model_dir:
        return CustomHooks()
    path = Path(model_dir) / "model.py"
    if not path.is_file():
        return CustomHooks()
    module = _import_model_py(path)
    found: dict[str, Callable[..., Any]] = {}
    for name in dir(module):
        obj = getattr(module, name)
        if not callable(obj) or getattr(obj, "__module__", None) != module.__name__:
            continue
        if getattr(obj, "is_input_formatter", False) or name == "input_formatter":
            found["input_formatter"] = obj
        if getattr(obj, "is_output_formatter", False) or name == "output_formatter":
            found["output_formatter"] = obj
    if found:
        LOG.info("model.py provides custom %s", ", ".join(sorted(found)))
    return CustomHooks(**found)


def _import_model_py(path: Path) -> ModuleType:
    for mod in list(sys.modules.values()):
        mod_file = getattr(mod, "__file__", None)
        if mod_file and Path(mod_file).resolve() == path.resolve():
            return mod
    spec = importlib.util.spec_from_file_location("djl_handlers_user_model", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
