"""The HF sampler's logit processors before temperature, batched over the rows that ask for them.

vLLM's semantics (``SamplingParams`` and its V1 sampler), in vLLM's order after the repetition
penalty that transformers and vLLM define alike:

- **bad words** (``bad_sequences``, vLLM's ``bad_words``): each word is tokenized as it stands and
  with one leading space (the second form only when it is a different token sequence of the same
  length, as vLLM decides it); a word's last token is banned at a step when its other tokens are
  the request's last *generated* tokens (the prompt does not count), so a one-token word is always
  banned;
- **eos suppression** while ``min_new_tokens`` (or HF's ``min_length``) is not reached;
- **frequency and presence penalties** (OpenAI's definition): ``logit -= frequency * count +
  presence * (count > 0)``, where ``count`` is how often the token was *generated* so far (the
  prompt does not count, as in vLLM).

Every processor is one batched torch operation over the rows that ask (their per-row state —
the seen mask, the counts, the tokens each bad word bans next — is gathered by reference, and
kept up to date by :meth:`PenaltyState.observe`, which the sampler calls once per row anyway); a
step in which no row asks does none of this.

This module imports torch; only the HF engine imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

_NEG_INF = float("-inf")

__all__ = ["GeneratePenalties", "PenaltyState", "apply_penalties", "bad_word_ids"]


def bad_word_ids(words: Sequence[str], tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """Token sequences of ``words`` as vLLM's ``SamplingParams.update_from_tokenizer`` builds them:
    each word without leading spaces, and ``" " + word`` too when that tokenizes to a different
    first token and as many tokens. ``ValueError`` for a word that tokenizes to nothing."""
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not plain:
            raise ValueError(f"bad word {word!r} tokenizes to no token")
        out.append(plain)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return tuple(dict.fromkeys(out))


@dataclass
class PenaltyState:
    """One row's penalties and what they need of its history.

    ``counts`` (float32 [vocab], on the logits' device once a step has run) exists only with a
    frequency or presence penalty; ``banned`` is the list of tokens the bad words ban at the next
    step (single-token words always, longer ones while their prefix ends the generated tokens).
    """

    vocab: int
    presence: float = 0.0
    frequency: float = 0.0
    bad_words: tuple[tuple[int, ...], ...] = ()
    counts: torch.Tensor | None = None
    banned: list[int] = field(default_factory=list)
    _recent: list[int] = field(default_factory=list)
    _window: int = 0

    def __post_init__(self) -> None:
        self._window = max((len(w) - 1 for w in self.bad_words), default=0)
        self.banned = [w[0] for w in self.bad_words if len(w) == 1]

    @property
    def counting(self) -> bool:
        """True when the row has a frequency or presence penalty."""
        return self.presence != 0.0 or self.frequency != 0.0

    @property
    def active(self) -> bool:
        """True when this row has any penalty or bad word."""
        return self.counting or bool(self.bad_words)

    def observe(self, token_id: int) -> None:
        """Record a generated token: its count, and the tokens the bad words ban next."""
        if self.counting and 0 <= token_id < self.vocab:
            if self.counts is None:
                self.counts = torch.zeros(self.vocab, dtype=torch.float32)
            self.counts[token_id] += 1.0
        if self._window:
            self._recent = (self._recent + [token_id])[-self._window :]
            self.banned = [w[-1] for w in self.bad_words if _ends_with(self._recent, w[:-1])]


def _ends_with(recent: list[int], prefix: tuple[int, ...]) -> bool:
    return not prefix or (len(recent) >= len(prefix) and tuple(recent[-len(prefix) :]) == prefix)


class _Row(Protocol):
    """What :func:`apply_penalties` reads of a row (``RowSampling``)."""

    repetition_penalty: float
    seen: torch.Tensor | None
    min_new_tokens: int
    generated: int
    eos_token_ids: tuple[int, ...]
    penalties: PenaltyState | None


def apply_penalties(x: torch.Tensor, rows: Sequence[_Row]) -> torch.Tensor:
    """``x`` [n, vocab] float32 (one row per entry of ``rows``, modified in place and returned)
    after the repetition penalty, the bad words, eos suppression and the frequency/presence
    penalties of the rows that ask for each; one batched operation per processor."""
    dev = x.device
    rep = [i for i, r in enumerate(rows) if r.seen is not None]
    if rep:  # only the seen entries are touched (a few hundred of a row's vocabulary)
        seen = torch.stack([rows[i].seen for i in rep]).to(dev)  # type: ignore[misc]
        pen = torch.tensor([rows[i].repetition_penalty for i in rep], dtype=x.dtype, device=dev)
        which, token = seen.nonzero(as_tuple=True)
        row = torch.tensor(rep, dtype=torch.long, device=dev)[which]
        value, factor = x[row, token], pen[which]
        x[row, token] = torch.where(value > 0, value / factor, value * factor)
    _mask(x, [(i, r.penalties.banned) for i, r in enumerate(rows) if r.penalties is not None and r.penalties.banned])
    _mask(x, [(i, r.eos_token_ids) for i, r in enumerate(rows) if r.generated < r.min_new_tokens and r.eos_token_ids])
    counting = [i for i, r in enumerate(rows) if r.penalties is not None and r.penalties.counting]
    started = [i for i in counting if rows[i].penalties.counts is not None]  # type: ignore[union-attr]
    if started:  # only the generated tokens' entries are touched
        states = [rows[i].penalties for i in started]
        counts = torch.stack([_on(s, dev) for s in states])  # type: ignore[arg-type]
        freq = torch.tensor([s.frequency for s in states], dtype=x.dtype, device=dev)  # type: ignore[union-attr]
        pres = torch.tensor([s.presence for s in states], dtype=x.dtype, device=dev)  # type: ignore[union-attr]
        which, token = counts.nonzero(as_tuple=True)
        row = torch.tensor(started, dtype=torch.long, device=dev)[which]
        x[row, token] = x[row, token] - freq[which] * counts[which, token] - pres[which]
    return x


def _on(state: PenaltyState, device: torch.device) -> torch.Tensor:
    """The row's counts on ``device`` (moved there once: later updates happen there)."""
    assert state.counts is not None
    if state.counts.device != device:
        state.counts = state.counts.to(device)
    return state.counts


def _mask(x: torch.Tensor, pairs: list[tuple[int, Sequence[int]]]) -> None:
    """Set ``x[i, t] = -inf`` for every token ``t`` listed for row ``i``: one indexed write."""
    if not pairs:
        return
    vocab = x.shape[-1]
    flat = [(i, t) for i, tokens in pairs for t in tokens if 0 <= t < vocab]
    if flat:
        index = torch.tensor(flat, dtype=torch.long, device=x.device)
        x[index[:, 0], index[:, 1]] = _NEG_INF


class GeneratePenalties:
    """A transformers logits processor for ``generate()`` (dynamic batching): the frequency/presence
    penalties and bad words of ``settings`` (``to_hf`` keys) for every row of the batch, counting
    only the tokens generated after the first call (the prompts)."""

    def __init__(self, settings: Mapping[str, Any], rows: int, vocab: int, tokenizer: Any) -> None:
        words = tuple(settings.get("bad_words", ()))
        ids = bad_word_ids(words, tokenizer) if words else ()
        presence = float(settings.get("presence_penalty", 0.0))
        frequency = float(settings.get("frequency_penalty", 0.0))
        self.rows = [_GenerateRow(PenaltyState(vocab, presence, frequency, ids)) for _ in range(rows)]
        self._width: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._width is None:
            self._width = int(input_ids.shape[1])
        else:
            for row, token in zip(self.rows, input_ids[:, -1].tolist(), strict=True):
                assert row.penalties is not None
                row.penalties.observe(int(token))
        return apply_penalties(scores.float().clone(), self.rows).to(scores.dtype)


@dataclass
class _GenerateRow:
    """The part of a sampler row :func:`apply_penalties` reads, for one ``generate()`` row."""

    penalties: PenaltyState | None
    repetition_penalty: float = 1.0
    seen: torch.Tensor | None = None
    min_new_tokens: int = 0
    generated: int = 0
    eos_token_ids: tuple[int, ...] = ()
