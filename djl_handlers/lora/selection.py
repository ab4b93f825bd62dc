"""Which adapter a request selects (pure: no engine, no ML library).

Sources, as DJL's input parser reads them, the later winning:

1. the body's top-level ``"adapters"``: a name, or in dynamic batch a list with one name per
   ``inputs`` entry (a single name applies to every prompt; ``""``/``null`` means the base model);
2. content entry ``adapter`` (DJL's ``adapter`` workflow function adds it);
3. header ``X-Amzn-SageMaker-Adapter-Identifier`` (SageMaker's inference components), with
   ``X-Amzn-SageMaker-Adapter-Alias`` used only in messages.

OpenAI bodies select by ``model``: ``"base:adapter"`` or a registered adapter's name (as vLLM does);
any other model name means the base model.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Optional, Protocol

from djl_handlers.errors import InvalidRequest

__all__ = ["ADAPTER_HEADER", "ALIAS_HEADER", "AdapterNames", "openai_adapter", "select_adapters"]

ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
ALIAS_HEADER = "X-Amzn-SageMaker-Adapter-Alias"


class AdapterNames(Protocol):
    """What selection needs from a registry: membership and a check raising ``AdapterNotFound``."""

    def __contains__(self, name: object) -> bool: ...

    def check(self, names: Collection[Optional[str]]) -> None: ...


def _content_text(item: Any, key: str) -> Optional[str]:
    value = item.get_content().get(key)
    if value is None:
        return None
    try:
        return bytes(value).decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InvalidRequest(f"content '{key}' is not UTF-8 text", field=key) from None


def _one(value: Any, where: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be an adapter name (string), got {type(value).__name__}",
                             field="adapters")
    return value.strip() or None


def select_adapters(body_value: Any, item: Any, prompts: int,
                    registry: Optional[AdapterNames]) -> tuple[Optional[str], ...]:
    """One adapter name (or None = base model) per prompt; ``()`` when the request names none.

    Raises ``InvalidRequest`` for a malformed selection and ``AdapterNotFound`` (404) for a name
    that is not registered (or any name when the model has adapters disabled)."""
    chosen: list[Optional[str]] = []
    alias: Optional[str] = None
    if body_value is not None:
        if isinstance(body_value, list):
            if len(body_value) not in (1, prompts):
                raise InvalidRequest(
                    f"adapters has {len(body_value)} entries but inputs has {prompts}; send one adapter "
                    "name per input", field="adapters")
            chosen = [_one(v, f"adapters[{i}]") for i, v in enumerate(body_value)]
        else:
            chosen = [_one(body_value, "adapters")]
    from_content = _content_text(item, "adapter")
    if from_content:
        chosen = [from_content]
    header = (item.get_property(ADAPTER_HEADER) or "").strip()
    if header:
        chosen = [header]
        alias = (item.get_property(ALIAS_HEADER) or "").strip() or None
    if not chosen or all(name is None for name in chosen):
        return ()
    if len(chosen) == 1:
        chosen = chosen * prompts
    _check(chosen, registry, alias)
    return tuple(chosen)


def _check(names: list[Optional[str]], registry: Optional[AdapterNames], alias: Optional[str]) -> None:
    from djl_handlers.lora.registry import AdapterNotFound

    if registry is None:
        wanted = alias or next(n for n in names if n)
        raise AdapterNotFound(f"adapter {wanted!r} is not registered: LoRA adapters are not enabled for "
                              "this model (option.enable_lora=true)", field="adapters")
    if alias is not None and any(n and n not in registry for n in names):
        raise AdapterNotFound(f"adapter {alias!r} is not registered", field="adapters")
    registry.check(names)


def openai_adapter(model: Any, registry: Optional[AdapterNames]) -> Optional[str]:
    """The adapter an OpenAI ``model`` selects: ``"base:adapter"`` or a registered adapter name."""
    if not isinstance(model, str) or not model:
        return None
    if ":" in model and registry is not None:  # without LoRA a colon is just part of a name
        name = model.split(":", 1)[1].strip()
        if not name:
            return None
        _check([name], registry, None)
        return name
    if registry is not None and model in registry:
        return model
    return None
