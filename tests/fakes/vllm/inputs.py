"""Mirror of ``vllm.inputs``: the prompt shapes ``LLMEngine.add_request`` accepts."""

from __future__ import annotations

from typing import TypedDict, Union


class TextPrompt(TypedDict, total=False):
    """A text prompt, tokenized by the engine."""

    prompt: str


class TokensPrompt(TypedDict, total=False):
    """A pre-tokenized prompt."""

    prompt_token_ids: list[int]


PromptType = Union[str, TextPrompt, TokensPrompt]
