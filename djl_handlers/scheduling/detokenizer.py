"""Incremental detokenization: turn a growing list of token ids into stable text pieces.

Decoding token by token loses the spaces that SentencePiece/BPE tokenizers attach to word
starts and splits multi-byte characters. We decode a short window of ids twice — up to the last
emitted position and up to now — and emit only the difference, holding text back while it ends
in U+FFFD (an incomplete UTF-8 sequence).

``spaces_between_special_tokens=False`` (vLLM's parameter; it matters only while special tokens
are shown) is passed to the tokenizer's ``decode``, which honours it where it puts spaces between
special tokens (transformers' Python tokenizers); the Rust-backed tokenizers put none there, so
for them both values give the same text, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

from djl_handlers.engines.base import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Per-request state; ``push(token_id)`` returns the newly stable text (maybe "")."""

    __slots__ = ("_tokenizer", "_ids", "_prefix_offset", "_read_offset", "_skip_special", "_extra")

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self._tokenizer = tokenizer
        # A few prompt ids give the tokenizer left context (e.g. whether a space is leading).
        tail = list(prompt_ids[-4:])
        self._ids: list[int] = tail
        self._prefix_offset = 0
        self._read_offset = len(tail)
        self._skip_special = skip_special_tokens
        shown = not skip_special_tokens and not spaces_between_special_tokens
        self._extra: dict[str, bool] = {"spaces_between_special_tokens": False} if shown else {}

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special, **self._extra)

    def push(self, token_id: int) -> str:
        """Add one token id; return the text that became stable with it."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT_CHAR):
            new_text = full_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return new_text
        return ""

    def flush(self) -> str:
        """Text still held back at the end of generation (an incomplete character, rendered as is)."""
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
