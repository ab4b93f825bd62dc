"""Choose between DJL's own ``djl_python`` I/O classes and ours.

Inside DJL Serving the worker imports ``djl_python`` from the jar before it calls a handler, and the
front end expects that package's ``Output`` back. Outside it, ours stand in. Nothing is imported
until a function here is called, and no package named ``djl_python`` is ever shipped.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["djl_python_classes", "io_classes", "is_djl_python_object", "new_output"]

_DJL_PACKAGE = "djl_python"


# (sys.path, whether sys.modules names djl_python) when importing it last failed: the worker asks once
# per request frame, and Python does not cache a failed import (it stats the path every time: ~10 %
# of a fake-engine step's worker time).
_absent_on: tuple[tuple[str, ...], bool] | None = None


def djl_python_classes() -> tuple[type, type] | None:
    """``(djl_python.inputs.Input, djl_python.outputs.Output)`` when importable, else ``None``."""
    global _absent_on
    inputs = sys.modules.get(f"{_DJL_PACKAGE}.inputs")
    outputs = sys.modules.get(f"{_DJL_PACKAGE}.outputs")
    try:
        if inputs is None or outputs is None:
            path = (tuple(sys.path), _DJL_PACKAGE in sys.modules)
            if path == _absent_on:
                return None
            try:
                inputs = inputs or importlib.import_module(f"{_DJL_PACKAGE}.inputs")
                outputs = outputs or importlib.import_module(f"{_DJL_PACKAGE}.outputs")
            except ImportError:
                _absent_on = path
                raise
        input_cls = inputs.Input
        output_cls = outputs.Output
    except (ImportError, AttributeError):
        return None
    if not isinstance(input_cls, type) or not isinstance(output_cls, type):
        return None
    return input_cls, output_cls


def io_classes() -> tuple[type, type]:
    """``(Input, Output)``: djl_python's when importable (as inside DJL Serving), else ours."""
    found = djl_python_classes()
    if found is not None:
        return found
    from djl_handlers.io.inputs import Input
    from djl_handlers.io.outputs import Output

    return Input, Output


def is_djl_python_object(obj: object) -> bool:
    """True when ``obj``'s class was defined in the ``djl_python`` package."""
    module = getattr(type(obj), "__module__", "") or ""
    return module == _DJL_PACKAGE or module.startswith(f"{_DJL_PACKAGE}.")


def new_output(like: object | None = None) -> Any:
    """A fresh ``Output`` of the same family as ``like`` (an ``Input``).

    A djl_python ``Input`` gets a ``djl_python.outputs.Output``; any other object gets ours; with no
    ``like`` the choice follows :func:`io_classes`.
    """
    if like is None:
        return io_classes()[1]()
    if is_djl_python_object(like):
        found = djl_python_classes()
        if found is not None:
            return found[1]()
    from djl_handlers.io.outputs import Output

    return Output()


def input_from_frame(properties: dict[str, str], content: list[tuple[str | None, bytes]]) -> Any:
    """The ``Input`` for one decoded request frame, of the family the handler expects
    (djl_python's inside DJL Serving): the worker and the in-process transport both use it."""
    item = io_classes()[0]()
    item.properties = properties
    for key, value in content:
        item.content.add(key=key, value=bytearray(value))
    item.function_name = properties.get("handler")
    return item
