"""Prompt-lookup proposals: the tokens that followed the latest earlier occurrence of a row's last n-gram."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["lookup"]


def lookup(context: Sequence[int], k: int, low: int, high: int) -> tuple[list[int], int]:
    """Up to ``k`` candidate next tokens for ``context`` (a row's prompt and generated tokens).

    The longest suffix of ``context`` of ``low`` to ``high`` tokens that also occurs earlier in it
    wins (among equally long ones, the latest occurrence); the candidates are the tokens that followed
    that occurrence (fewer than ``k`` when it ends near the end of ``context``). Returns them and the
    matched n-gram's length; no match: ``([], 0)``.
    """
    n = len(context)
    if k < 1 or n < low + 1:
        return [], 0
    tokens = context if isinstance(context, list) else list(context)
    last = tokens[-1]
    ends: list[int] = []  # earlier occurrences of the last token (``list.index`` scans in C)
    try:
        at = tokens.index(last, 0, n - 1)
        while True:
            ends.append(at)
            at = tokens.index(last, at + 1, n - 1)
    except ValueError:
        pass
    best_len, best_end = 0, -1
    limit = min(high, n - 1)
    for end in reversed(ends):  # the latest first: among equally long matches it wins
        length = 1
        while length < limit and end - length >= 0 and tokens[end - length] == tokens[n - 1 - length]:
            length += 1
        if length > best_len:
            best_len, best_end = length, end
            if length == limit:
                break
    if best_len < low:
        return [], 0
    return tokens[best_end + 1 : best_end + 1 + k], best_len
