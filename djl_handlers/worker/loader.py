"""Load a handler entry point and call it the way DJL's Python engine does.

Shared by the socket worker (:mod:`djl_handlers.worker.process`) and the in-process transport used by
``djl-handlers generate`` (:mod:`djl_handlers.worker.in_process`), so both map handler results and
exceptions identically:

* ``None`` → ``Output(code=204, message="No content")``;
* a value without ``send`` (not an ``Output``) → 424 ``Invalid output type: ...``;
* ``OutOfMemoryError``/``MemoryError`` (by class name) or an error whose status is 507 → 507 with the
  exception text as message and no body;
* any other exception → ``Output().error(message)`` (424), the message never empty.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from djl_handlers.errors import message_of, status_of
from djl_handlers.protocol.startup import recommended_for

__all__ = ["HandlerService", "load_entry_point", "map_exception", "map_result"]

_LOG = logging.getLogger(__name__)
_OOM_NAMES = ("OutOfMemoryError", "MemoryError")


def _output_class() -> type:
    """djl_python's ``Output`` when importable (inside DJL Serving), else ours."""
    from djl_handlers.io.compat import io_classes

    return io_classes()[1]


def load_entry_point(entry_point: str, model_dir: str | os.PathLike[str]) -> ModuleType:
    """Import ``entry_point`` as DJL's ``service_loader`` does.

    An absolute path to a ``.py`` file is loaded as module ``model``; a relative ``name.py`` must
    exist in the model directory and is imported as ``name`` from that file (replacing a cached
    module of the same name, e.g. another directory's ``model``); anything else is a dotted module.
    The model directory is put first on ``sys.path``.
    """
    model_path = Path(model_dir).resolve()
    if str(model_path) not in sys.path:
        sys.path.insert(0, str(model_path))
    if os.path.isabs(entry_point):
        return _load_file(Path(entry_point), "model")
    if entry_point.endswith(".py"):
        target = model_path / entry_point
        if not target.is_file():
            raise FileNotFoundError(f"entry point {entry_point!r} not found in {model_path}")
        return _load_file(target, entry_point[: -len(".py")].replace("/", "."))
    return importlib.import_module(entry_point)


def _load_file(path: Path, name: str) -> ModuleType:
    """Import a Python source file under module name ``name``."""
    if not path.is_file():
        raise FileNotFoundError(f"entry point file {str(path)!r} does not exist")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load entry point file {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def map_exception(exc: BaseException) -> Any:
    """The ``Output`` DJL's engine sends for a handler exception (507 for OOM, else 424)."""
    output_cls = _output_class()
    message = message_of(exc)
    if type(exc).__name__ in _OOM_NAMES or status_of(exc) == 507:
        return output_cls(code=507, message=message)
    return output_cls().error(message)


def map_result(result: Any) -> Any:
    """The ``Output`` to send for a handler's return value."""
    output_cls = _output_class()
    if result is None:
        return output_cls(code=204, message="No content")
    if not callable(getattr(result, "send", None)):
        return output_cls().error(f"Invalid output type: {type(result).__name__}")
    return result


class HandlerService:
    """One entry point, loaded once on first use, called per message like DJL's ``ModelService``.

    As in DJL 0.34's worker, a model file (``model.py``) without the handler function is replaced
    by the recommended entry point (``recommended``, else computed by ``recommended_for``) on the
    first call; the model file's formatters are still used (``custom_hooks``).
    """

    def __init__(self, entry_point: str, model_dir: str | os.PathLike[str],
                 recommended: str | None = None) -> None:
        """Remember what to load; nothing is imported yet."""
        self.entry_point = entry_point
        self.model_dir = str(Path(model_dir).resolve())
        self.recommended = recommended
        self._module: ModuleType | None = None
        self._verified = False

    def module(self) -> ModuleType:
        """The loaded entry-point module (imported on the first call)."""
        if self._module is None:
            self._module = load_entry_point(self.entry_point, self.model_dir)
        return self._module

    def _fall_back(self, name: str) -> ModuleType | None:
        """Load the recommended entry point in place of a model file without ``name``."""
        if self.recommended is None:
            self.recommended = recommended_for(self.entry_point, self.model_dir)
        recommended = self.recommended
        if recommended is None:
            return None
        _LOG.info("%s has no handler function %s; using the recommended entry point %s",
                  self.entry_point, name, recommended)
        self._module = load_entry_point(recommended, self.model_dir)
        return self._module

    def invoke(self, inputs: Any) -> Any:
        """Call the function named by ``inputs``' ``handler`` property (default ``handle``).

        Never raises for a handler problem: every failure becomes an error ``Output``.
        """
        function = self._function(inputs)
        if not callable(function):
            return function  # the error Output
        try:
            result = function(inputs)
        except Exception as exc:
            _LOG.exception("handler %s failed", self.entry_point)
            return map_exception(exc)
        return map_result(result)

    async def invoke_async(self, inputs: Any) -> Any:
        """DJL's async engine's call: ``await`` the handler function; an ``Output``, an async
        generator of them, or the error ``Output`` (507 for OOM, else 424) — never raises."""
        function = self._function(inputs)
        if not callable(function):
            return function
        try:
            result = function(inputs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            _LOG.exception("handler %s failed", self.entry_point)
            return map_exception(exc)
        if inspect.isasyncgen(result):
            return result
        return map_result(result)

    def _function(self, inputs: Any) -> Any:
        """The handler function ``inputs`` names, or an error ``Output`` saying why there is none."""
        name = getattr(inputs, "function_name", None) or inputs.get_properties().get("handler") or "handle"
        inputs.get_properties()["model_dir"] = self.model_dir
        try:
            module = self.module()
        except Exception as exc:  # import errors become the reply, e.g. to the init call
            _LOG.exception("failed to load entry point %s", self.entry_point)
            message = f"failed to load entry point {self.entry_point!r}: {message_of(exc)}"
            return _output_class()().error(message)
        function = getattr(module, name, None)
        if not callable(function) and not self._verified:
            self._verified = True
            try:
                module = self._fall_back(name) or module
            except Exception as exc:
                _LOG.exception("failed to load the recommended entry point")
                return _output_class()().error(f"failed to load entry point {self.recommended!r}: {message_of(exc)}")
            function = getattr(module, name, None)
        self._verified = True
        if not callable(function):
            return _output_class()().error(f"entry point {self.entry_point!r} has no function {name!r}")
        return function
