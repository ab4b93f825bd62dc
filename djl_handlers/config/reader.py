"""Typed reads of the option and server maps behind ``ServingConfig``; every failure is a ``ConfigError``
naming the key, the bad value and what is allowed. Empty values count as unset."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from djl_handlers.errors import ConfigError

_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})


class Reader:
    """Typed access to the option/server maps; every failure is a ``ConfigError``."""

    def __init__(self, options: Mapping[str, str], server: Mapping[str, str]) -> None:
        self.options = options
        self.server = server

    def get(self, key: str, *aliases: str, server: bool = False) -> tuple[str, str] | None:
        """``(label, stripped value)`` of the first non-empty key; server keys looked up first."""
        for name in (key, *aliases):
            if server and str(self.server.get(name, "")).strip():
                return name, str(self.server[name]).strip()
            value = str(self.options.get(name, "")).strip()
            if value:
                return f"option.{name}", value
        return None

    @staticmethod
    def fail(label: str, value: str, allowed: str) -> ConfigError:
        """The one error shape: key, bad value, what is allowed."""
        return ConfigError(f"{label}={value!r} is invalid; allowed: {allowed}", field=label)

    def text(self, key: str, default: str | None = None, *aliases: str) -> str | None:
        found = self.get(key, *aliases)
        return found[1] if found else default

    def boolean(self, key: str, default: bool) -> bool:
        found = self.get(key)
        if found is None:
            return default
        word = found[1].lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise self.fail(*found, "true, false, 1 or 0 (case-insensitive)")

    def integer(self, key: str, default: int | None, minimum: int = 0, *,
                server: bool = False) -> int | None:
        found = self.get(key, server=server)
        if found is None:
            return default
        label, value = found
        if not re.fullmatch(r"-?\d{1,18}", value) or int(value) < minimum:
            raise self.fail(label, value, f"an integer >= {minimum}")
        return int(value)

    def number(self, key: str, default: float, low: float, high: float) -> float:
        found = self.get(key)
        if found is None:
            return default
        label, value = found
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (low < number <= high):
            raise self.fail(label, value, f"a number in ({low}, {high}]")
        return number

    def choice(self, key: str, default: str, allowed: tuple[str, ...], *aliases: str) -> str:
        found = self.get(key, *aliases)
        if found is None:
            return default
        word = found[1].lower()
        if word not in allowed:
            # "" in ``allowed`` is the unset default (``get`` skips empty values): not listed
            raise self.fail(found[0], found[1], ", ".join(a for a in allowed if a))
        return word
