"""``PairList``: djl_python's ordered multimap (parallel ``keys``/``values`` lists, duplicates allowed)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["PairList"]


class PairList:
    """Ordered key/value pairs with djl_python's public API.

    ``keys`` and ``values`` are public lists, as in djl_python. Unlike djl_python, the ``pair_list=``
    and ``pair_map=`` constructor arguments and :meth:`add_all` work.
    """

    def __init__(
        self,
        keys: list[Any] | None = None,
        values: list[Any] | None = None,
        pair_list: Iterable[tuple[Any, Any]] | None = None,
        pair_map: Mapping[Any, Any] | None = None,
    ) -> None:
        """Build from parallel ``keys``/``values`` lists, a list of pairs, or a mapping (else empty)."""
        self.keys: list[Any] = []
        self.values: list[Any] = []
        if keys is not None and values is not None:
            if len(keys) != len(values):
                raise ValueError("key value size mismatch.")
            self.keys = keys
            self.values = values
        elif pair_list is not None:
            for key, value in pair_list:
                self.keys.append(key)
                self.values.append(value)
        elif pair_map is not None:
            for key, value in pair_map.items():
                self.keys.append(key)
                self.values.append(value)

    def add(
        self,
        key: Any = None,
        value: Any = None,
        index: int | None = None,
        pair: tuple[Any, Any] | None = None,
    ) -> None:
        """Insert ``(key, value)`` at ``index``, else append ``pair``, else append ``(key, value)``.

        As in djl_python a ``None`` value is ignored (a ``pair`` is appended as given); empty values
        such as ``b""`` are kept.
        """
        if index is not None and value is not None:
            self.keys.insert(index, key)
            self.values.insert(index, value)
        elif pair:
            self.keys.append(pair[0])
            self.values.append(pair[1])
        elif value is not None:
            self.keys.append(key)
            self.values.append(value)

    def add_all(self, other: PairList | None) -> None:
        """Append every pair of ``other`` in order."""
        if other is not None:
            self.keys.extend(other.keys)
            self.values.extend(other.values)

    def size(self) -> int:
        """Number of pairs."""
        return len(self.keys)

    def is_empty(self) -> bool:
        """True when there are no pairs."""
        return not self.keys

    def get(self, key: Any) -> Any:
        """Value of the first pair with ``key``, or ``None``."""
        for i, candidate in enumerate(self.keys):
            if candidate == key:
                return self.values[i]
        return None

    def key_at(self, index: int) -> Any:
        """Key of pair ``index``."""
        return self.keys[index]

    def value_at(self, index: int) -> Any:
        """Value of pair ``index``."""
        return self.values[index]

    def get_keys(self) -> list[Any]:
        """The key list (not a copy, as in djl_python)."""
        return self.keys

    def get_values(self) -> list[Any]:
        """The value list (not a copy, as in djl_python)."""
        return self.values

    def __repr__(self) -> str:
        """Debug representation listing the pairs."""
        return f"PairList({list(zip(self.keys, self.values, strict=False))!r})"
