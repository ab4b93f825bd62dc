"""DJL's adapter calls on one service: ``register_adapter``, ``update_adapter``, ``unregister_adapter``.

DJL's front end sends them as an ``Input`` whose ``handler`` property names the function (see
:mod:`.registry`). Each returns an ``Output``: 200 with message ``Adapter <alias> registered`` (the
front end answers ``{"status": message}``), or an error Output whose code and message the front end
passes on (400 bad call, 404 unknown adapter, 507 limits). An adapter that running requests use is
unregistered at once for new requests (they get 404) and unloaded from the engine when the last
request using it finishes (:meth:`AdapterManager.retire_unused`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Optional

from djl_handlers.errors import DjlHandlersError, message_of, status_of
from djl_handlers.lora.registry import AdapterError, AdapterRegistry, AdapterSpec, spec_from_input

LOG = logging.getLogger(__name__)

__all__ = ["AdapterManager", "lora_disabled_output"]


def _output(like: Any, code: int = 200, message: str = "OK") -> Any:
    from djl_handlers.io.compat import new_output

    out = new_output(like)
    out.code, out.message = code, message
    return out


def _error_output(like: Any, exc: BaseException) -> Any:
    text = message_of(exc)
    return _output(like).error(text, code=status_of(exc), message=text)


def lora_disabled_output(like: Any) -> Any:
    """The answer to an adapter call on a model without ``option.enable_lora=true``."""
    return _error_output(like, AdapterError("LoRA adapters are not enabled for this model; set "
                                            "option.enable_lora=true", field="option.enable_lora"))


class AdapterManager:
    """The registry of one service plus the engine calls that load and unload adapters.

    ``engine`` must have ``load_adapter(spec)`` (load or replace by name; with ``preload=False`` it may
    defer loading to first use) and ``unload_adapter(name)``. ``in_use()`` lists the adapter names of
    the requests still running.
    """

    def __init__(self, engine: Any, in_use: Callable[[], Iterable[Optional[str]]]) -> None:
        for method in ("load_adapter", "unload_adapter"):
            if not callable(getattr(engine, method, None)):
                from djl_handlers.errors import ConfigError

                raise ConfigError(f"engine {getattr(engine, 'name', type(engine).__name__)!r} does not support "
                                  "LoRA adapters (option.enable_lora)", field="option.enable_lora")
        self.engine = engine
        self.registry = AdapterRegistry()
        self._in_use = in_use

    # -- DJL's three calls -------------------------------------------------------------------
    def register(self, inputs: Any) -> Any:
        """``register_adapter``: load (unless ``preload=false``) and register."""
        try:
            spec = spec_from_input(inputs)
            old = self.registry.get(spec.name)
            if old is not None:
                if old.src != spec.src:
                    raise AdapterError(
                        f"adapter {spec.label!r} is already registered from {old.src!r}; unregister it "
                        "before registering a new adapter with the same name", field="name")
                # Same name and source: DJL's front end re-sends registrations to a restarted worker.
            self.registry.add(spec)
            try:
                self.engine.load_adapter(spec)
            except BaseException:
                if old is None:
                    self.registry.remove(spec.name)
                raise
        except DjlHandlersError as exc:
            return _error_output(inputs, exc)
        except Exception as exc:  # noqa: BLE001 - a broken adapter folder is this call's error
            LOG.exception("register_adapter failed")
            return _error_output(inputs, AdapterError(f"cannot load adapter: {message_of(exc)}", field="src"))
        LOG.info("registered adapter %s from %s", spec.label, spec.src)
        return _output(inputs, 200, f"Adapter {spec.label} registered")

    def update(self, inputs: Any) -> Any:
        """``update_adapter``: change ``preload``/``pin`` (and the alias); a new ``src`` is refused."""
        try:
            spec = spec_from_input(inputs, need_src=False)
            old = self.registry.require(spec.name, spec.alias)
            if spec.src and spec.src != old.src:
                raise AdapterError(f"adapter {spec.label!r}: changing src is not supported; unregister it and "
                                   "register it again", field="src")
            if old.pin and not spec.pin:
                raise AdapterError(f"adapter {spec.label!r} is pinned; unpinning is not supported (unregister "
                                   "it and register it again without pin)", field="pin")
            new = replace(spec, src=old.src)
            self.engine.load_adapter(new)
            self.registry.update(new)
        except DjlHandlersError as exc:
            return _error_output(inputs, exc)
        except Exception as exc:  # noqa: BLE001
            LOG.exception("update_adapter failed")
            return _error_output(inputs, AdapterError(f"cannot update adapter: {message_of(exc)}"))
        return _output(inputs, 200, f"Adapter {new.label} updated")

    def unregister(self, inputs: Any) -> Any:
        """``unregister_adapter``: new requests can no longer use it; running ones finish with it."""
        try:
            name = (inputs.get_property("name") or "").strip()
            alias = (inputs.get_property("alias") or "").strip()
            spec = self.registry.remove(name, alias)
        except DjlHandlersError as exc:
            return _error_output(inputs, exc)
        label = alias or spec.label
        if name in set(self._in_use()):
            self.registry.retiring.add(name)
            LOG.info("adapter %s unregistered; unloading it when its running requests finish", label)
        else:
            self._unload(name)
        return _output(inputs, 200, f"Adapter {label} unregistered")

    # -- housekeeping ------------------------------------------------------------------------
    def retire_unused(self) -> None:
        """Unload retiring adapters that no running request uses any more (after every step)."""
        if not self.registry.retiring:
            return
        used = set(self._in_use())
        for name in [n for n in self.registry.retiring if n not in used]:
            self.registry.retiring.discard(name)
            self._unload(name)

    def _unload(self, name: str) -> None:
        try:
            self.engine.unload_adapter(name)
        except Exception:  # noqa: BLE001 - the adapter is unregistered whatever the engine says
            LOG.exception("unloading adapter %s failed", name)

    def specs(self) -> list[AdapterSpec]:
        """Registered adapters, in registration order."""
        return [s for n in self.registry.names() if (s := self.registry.get(n)) is not None]
