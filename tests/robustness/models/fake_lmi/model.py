"""``InferenceService`` (the same pipeline as ``djl_handlers.huggingface``) on the fake engine.

The fake engine answers with a fixed text, so responses are exactly predictable; it has a trivial
chat template so OpenAI chat bodies get past it. ``option.fake_step_delay`` (seconds) slows each
engine step down to make the rolling batch fill up under load.
"""

from __future__ import annotations

import time
from typing import Any

from djl_handlers.engines.fake import ByteTokenizer, FakeEngine
from djl_handlers.service import InferenceService


class ChatTokenizer(ByteTokenizer):
    """The byte tokenizer plus a ``<role>content`` chat template."""

    chat_template = "fake"

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        """Render the messages, then ``<assistant>``."""
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class SlowFakeEngine(FakeEngine):
    """The fake engine with a fixed delay per step."""

    delay = 0.0

    def step(self) -> Any:
        """Sleep ``delay`` seconds, then step."""
        if self.delay:
            time.sleep(self.delay)
        return super().step()


def _engine(config: Any) -> FakeEngine:
    engine = SlowFakeEngine()
    engine.tokenizer = ChatTokenizer()
    engine.delay = float((getattr(config, "raw", {}) or {}).get("fake_step_delay", 0))
    return engine


_SERVICE = InferenceService("huggingface", engine_factory=_engine)


def handle(inputs: Any) -> Any:
    """DJL's entry point."""
    return _SERVICE.handle(inputs)


def djl_handlers_query(inputs: Any) -> Any:
    """djl_handlers' query call (model facts, tokenize, detokenize) for the local server's routes."""
    return _SERVICE.query(inputs)
