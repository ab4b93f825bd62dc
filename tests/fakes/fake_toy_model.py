"""The deterministic toy "model" behind the fake vLLM and TensorRT-LLM packages (test-only, not part of either API).

Vocabulary: id 0 is ``</s>`` (eos); ids 1..N-1 are words. The tokenizer splits on whitespace
(unknown words map to a stable id) and decodes every word with a leading space, like a
SentencePiece tokenizer does. The model continues with ``next = (last + 1) % N``, so a prompt
ending in "Deep" produces " learning is a really cool field ..." and reaches ``</s>`` after
the word "people". When the engine's sampling parameters ask for sampling, each token is drawn
from a ``random.Random`` seeded with the request's seed instead. Log-probabilities are a fixed function of the token id.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Optional

VOCAB: tuple[str, ...] = (
    "</s>",
    "Deep",
    "learning",
    "is",
    "a",
    "really",
    "cool",
    "field",
    "and",
    "it",
    "keeps",
    "growing",
    "every",
    "day",
    "with",
    "new",
    "ideas",
    "from",
    "many",
    "people",
)
EOS_ID = 0
_INDEX = {w: i for i, w in enumerate(VOCAB)}


class ToyTokenizer:
    """The part of a Hugging Face tokenizer that the adapters and the fake engine use."""

    eos_token_id = EOS_ID
    eos_token = "</s>"
    pad_token_id = None
    bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = []
        for word in text.split():
            ids.append(_INDEX.get(word, 1 + sum(word.encode("utf-8")) % (len(VOCAB) - 1)))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        words = [VOCAB[i] for i in ids if not (skip_special_tokens and i == EOS_ID)]
        return "".join(" " + w for w in words)

    def __len__(self) -> int:
        return len(VOCAB)


def next_token(last: int, rng: Optional[random.Random] = None) -> int:
    """The toy model: the id after ``last``, wrapping to eos (greedy); with ``rng`` (the engine
    samples) any word id drawn from it instead, so sampling is visible in the text."""
    if rng is not None:
        return rng.randrange(1, len(VOCAB))
    return (last + 1) % len(VOCAB)


def token_logprob(token_id: int) -> float:
    """A fixed, distinct log-probability per token id."""
    return -0.05 - 0.1 * (token_id % 7)


def beam_candidates(last: int) -> list[tuple[int, float]]:
    """The toy model's next-token distribution for beam search: the greedy successor of ``last`` (p 0.6),
    the one after it (0.3) and the next (0.1); every other token has probability 0."""
    size = len(VOCAB)
    return [((last + 1) % size, math.log(0.6)), ((last + 2) % size, math.log(0.3)), ((last + 3) % size, math.log(0.1))]
