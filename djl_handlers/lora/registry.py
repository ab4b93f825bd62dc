"""The adapters one service knows, and the errors of DJL's adapter API.

DJL's front end calls the worker with property ``handler`` = ``register_adapter`` /
``update_adapter`` / ``unregister_adapter`` and properties ``name``, ``alias``, ``src``; the query
parameters of the management request (``preload``, ``pin``, ...) arrive as content entries.
:class:`AdapterSpec` is that call, parsed; :class:`AdapterRegistry` keeps the registered specs and
the names being retired (unregistered while running requests still use them). Nothing here imports
an ML library.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from djl_handlers.errors import DjlHandlersError, InvalidRequest

__all__ = ["AdapterError", "AdapterLimit", "AdapterNotFound", "AdapterRegistry", "AdapterSpec", "spec_from_input"]


class AdapterNotFound(InvalidRequest):
    """A request or management call names an adapter that is not registered (HTTP 404)."""

    status = 404
    kind = "adapter_not_found"


class AdapterError(InvalidRequest):
    """A management call that cannot be done: bad ``src``, bad options, duplicate name (HTTP 400)."""

    kind = "adapter_error"


class AdapterLimit(DjlHandlersError):
    """``max_cpu_loras``/``max_lora_rank`` exceeded: the adapter cannot be loaded (HTTP 507, as DJL
    maps vLLM's "No free lora slots" to a MemoryError)."""

    status = 507
    kind = "adapter_limit"


@dataclass(frozen=True)
class AdapterSpec:
    """One registered adapter: DJL's name/alias/src plus the ``preload`` and ``pin`` options."""

    name: str
    src: str
    alias: str = ""
    preload: bool = True
    pin: bool = False
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The name users know it by (the alias when one was given), for messages."""
        return self.alias or self.name


def _flag(value: str | None, default: bool, key: str) -> bool:
    if value is None or value.strip() == "":
        return default
    word = value.strip().lower()
    if word in ("true", "1"):
        return True
    if word in ("false", "0"):
        return False
    raise AdapterError(f"{key}={value!r} is not a boolean (true/false)", field=key)


def _content_strings(inputs: Any) -> dict[str, str]:
    """Content entries as text (DJL puts the management request's query parameters there)."""
    out: dict[str, str] = {}
    content = inputs.get_content()
    for key, value in zip(content.get_keys(), content.get_values(), strict=False):
        if isinstance(key, str) and isinstance(value, (bytes, bytearray)):
            try:
                out[key] = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                continue
    return out


def spec_from_input(inputs: Any, *, need_src: bool = True) -> AdapterSpec:
    """Parse DJL's ``register_adapter``/``update_adapter``/``unregister_adapter`` Input."""
    name = (inputs.get_property("name") or "").strip()
    if not name:
        raise AdapterError("the adapter call has no 'name' property", field="name")
    if "/" in name or name in (".", ".."):
        raise AdapterError(f"adapter name {name!r} must not contain '/'", field="name")
    alias = (inputs.get_property("alias") or "").strip()
    options = _content_strings(inputs)
    src = (inputs.get_property("src") or options.get("src") or "").strip()
    if src.startswith("file://"):
        src = src[len("file://"):]
    if need_src:
        if not src:
            raise AdapterError(f"adapter {alias or name!r}: 'src' is required", field="src")
        if not os.path.isdir(src):
            raise AdapterError(
                f"adapter {alias or name!r}: src {src!r} is not a local folder (only local LoRA adapters "
                "are supported)", field="src")
    preload = _flag(options.get("preload"), True, "preload")
    pin = _flag(options.get("pin"), False, "pin")
    if pin and not preload:
        raise AdapterError("an adapter cannot be pinned without being preloaded (pin=true, preload=false)",
                           field="pin")
    return AdapterSpec(name=name, src=src, alias=alias, preload=preload, pin=pin, options=options)


class AdapterRegistry:
    """Registered adapters of one service, by name (insertion order kept)."""

    def __init__(self) -> None:
        self._specs: dict[str, AdapterSpec] = {}
        self.retiring: set[str] = set()  # unregistered, still used by running requests

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def get(self, name: str) -> AdapterSpec | None:
        """The spec registered under ``name``, or None."""
        return self._specs.get(name)

    def names(self) -> list[str]:
        """Registered names in registration order."""
        return list(self._specs)

    def add(self, spec: AdapterSpec) -> None:
        """Register ``spec``; a name still retiring cannot be reused until its requests finish."""
        if spec.name in self.retiring:
            raise AdapterError(
                f"adapter {spec.label!r} was unregistered and running requests still use it; "
                "register it again once they finish", field="name")
        self._specs[spec.name] = spec

    def update(self, spec: AdapterSpec) -> AdapterSpec:
        """Replace the spec of a registered name; returns the old one."""
        old = self.require(spec.name, spec.alias)
        self._specs[spec.name] = replace(spec, src=spec.src or old.src)
        return old

    def remove(self, name: str, alias: str = "") -> AdapterSpec:
        """Unregister ``name`` (new requests can no longer use it); returns its spec."""
        spec = self.require(name, alias)
        del self._specs[name]
        return spec

    def require(self, name: str, alias: str = "") -> AdapterSpec:
        """The spec of ``name``; :class:`AdapterNotFound` naming it otherwise."""
        spec = self._specs.get(name)
        if spec is None:
            raise AdapterNotFound(f"adapter {alias or name!r} is not registered", field="adapters")
        return spec

    def check(self, names: Iterable[str | None]) -> None:
        """Every non-empty name in ``names`` must be registered (else :class:`AdapterNotFound`)."""
        for name in names:
            if name and name not in self._specs:
                raise AdapterNotFound(f"adapter {name!r} is not registered", field="adapters")
