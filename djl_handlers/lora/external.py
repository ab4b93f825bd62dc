"""LoRA adapters for engines that apply them themselves (vLLM, TensorRT-LLM): one ``LoRARequest`` per
registered adapter, passed with every request that selects it.

vLLM: ``LoRARequest(lora_name, lora_int_id, lora_path)`` (ids > 0, unique per adapter);
registration calls ``LLMEngine.add_lora`` (loads it now: a bad folder or a rank above
``max_lora_rank`` fails the registration), ``pin_lora`` for ``pin=true``, ``remove_lora`` on
unregister. TensorRT-LLM's LLM API has no add/remove call: the adapter is loaded from
``lora_path`` by the first request that names it (its ``max_loras``/``max_cpu_loras`` caches evict
least recently used ones), so registration checks the folder and keeps the ``LoRARequest``.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable
from typing import Any, Optional

from djl_handlers.lora.registry import AdapterError, AdapterLimit, AdapterNotFound, AdapterSpec

LOG = logging.getLogger(__name__)

__all__ = ["EngineLoras", "vllm_loras", "trtllm_loras"]

_LIMIT_WORDS = ("max_lora_rank", "No free lora slots", "greater than the number of GPU LoRA slots")


class EngineLoras:
    """Registered adapters of one engine as the engine's own ``LoRARequest`` objects."""

    def __init__(self, make: Callable[[str, int, str], Any], first_id: int = 1,
                 add: Optional[Callable[[Any], Any]] = None, remove: Optional[Callable[[int], Any]] = None,
                 pin: Optional[Callable[[int], Any]] = None) -> None:
        self._make, self._add, self._remove, self._pin = make, add, remove, pin
        self._ids = itertools.count(first_id)
        self.requests: dict[str, Any] = {}
        self._src: dict[str, str] = {}
        self._added: set[str] = set()  # names add_lora accepted (vLLM answers False for a loaded id)

    def load(self, spec: AdapterSpec) -> None:
        """Register (or update) ``spec``; the same name and folder keep their id."""
        if not os.path.isfile(os.path.join(spec.src, "adapter_config.json")):
            raise AdapterError(f"{spec.src!r} has no adapter_config.json (not a PEFT adapter folder)", field="src")
        request = self.requests.get(spec.name)
        if request is None or self._src.get(spec.name) != spec.src:
            request = self._make(spec.name, next(self._ids), spec.src)
            self._added.discard(spec.name)
        if spec.preload and self._add is not None and spec.name not in self._added:
            try:
                accepted = self._add(request)
            except (ValueError, RuntimeError) as exc:
                raise _engine_error(spec, exc) from exc
            if accepted is False:
                raise AdapterError(f"the engine refused adapter {spec.label!r}", field="src")
            self._added.add(spec.name)
        if spec.pin and self._pin is not None:
            try:
                self._pin(_int_id(request))
            except (ValueError, RuntimeError) as exc:
                raise _engine_error(spec, exc) from exc
        self.requests[spec.name] = request
        self._src[spec.name] = spec.src

    def unload(self, name: str) -> None:
        """Forget ``name`` (and remove it from the engine's cache)."""
        request = self.requests.pop(name, None)
        self._src.pop(name, None)
        self._added.discard(name)
        if request is not None and self._remove is not None:
            self._remove(_int_id(request))

    def request_for(self, name: str) -> Any:
        """The ``LoRARequest`` of registered adapter ``name``."""
        request = self.requests.get(name)
        if request is None:
            raise AdapterNotFound(f"adapter {name!r} is not registered", field="adapters")
        return request


def _int_id(request: Any) -> int:
    return int(request.lora_int_id)


def _engine_error(spec: AdapterSpec, exc: BaseException) -> Exception:
    text = f"cannot load adapter {spec.label!r}: {exc}"
    if any(word in str(exc) for word in _LIMIT_WORDS):
        return AdapterLimit(text, field="option.max_lora_rank" if "rank" in str(exc) else "option.max_loras")
    return AdapterError(text, field="src")


def vllm_loras(engine: Any) -> EngineLoras:
    """Adapters of a vLLM ``LLMEngine`` (``vllm.lora.request.LoRARequest``, ids from 1)."""
    from vllm.lora.request import LoRARequest

    def make(name: str, lora_id: int, path: str) -> Any:
        return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)

    return EngineLoras(make, 1, engine.add_lora, engine.remove_lora, getattr(engine, "pin_lora", None))


def trtllm_loras(llmapi: Any) -> EngineLoras:
    """Adapters for TensorRT-LLM's LLM API (``tensorrt_llm.llmapi.LoRARequest``, loaded on first use)."""
    make_request = llmapi.LoRARequest

    def make(name: str, lora_id: int, path: str) -> Any:
        return make_request(name, lora_id, path)

    return EngineLoras(make, 0)
