"""A reply read as it streams: reasoning, content and tool calls, as deltas.

``read_reply`` reads a finished reply once; ``ReplyStream.feed`` reads the text so far and returns
only what is new since its last call: reasoning and content fragments, and per call a first delta
with its name (the dialect adds the id) and then fragments of its arguments. A parser's readings
only grow, so a delta is the new tail of each field. A finished reply that the whole-reply reading
takes otherwise than its stream did (calls that never closed, reasoning that never ended) keeps
the stream's reading, as vLLM's streams do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.parsers.reasoning.base import ReasoningParser, ReasoningSplit
from djl_handlers.parsers.tools.base import ParsedCall, ToolParser, normalized_arguments

__all__ = ["CallDelta", "Reply", "ReplyDelta", "ReplyStream", "read_reply"]


@dataclass
class Reply:
    """A finished reply: ``reasoning`` (None: none), ``content`` (None: none), the ``calls``
    (arguments as JSON) and ``content_start``, the offset of the answer in the text."""

    reasoning: Optional[str]
    content: Optional[str]
    calls: list[ParsedCall]
    content_start: int = 0


@dataclass
class CallDelta:
    """A fragment of call ``index``: ``name`` on its first fragment only."""

    index: int
    name: Optional[str]
    arguments: str


@dataclass
class ReplyDelta:
    """What one ``feed`` found new."""

    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


def _split(reasoning: Optional[ReasoningParser], text: str, final: bool) -> ReasoningSplit:
    return reasoning.split(text, final) if reasoning is not None else ReasoningSplit(None, text, 0)


def read_reply(text: str, reasoning: Optional[ReasoningParser], tools: Optional[ToolParser],
               specs: list[dict[str, Any]]) -> Reply:
    """A finished reply's reasoning, content and calls."""
    split = _split(reasoning, text, True)
    content, calls = split.content, []
    if tools is not None and content is not None:
        parsed = tools.parse(content, True, specs)
        content, calls = parsed.content, [c for c in parsed.calls if c.complete]
        for call in calls:
            call.arguments = normalized_arguments(call.arguments)
    return Reply(split.reasoning, content, calls, split.content_start)


@dataclass
class ReplyStream:
    """The parsers of one streamed reply and what has been sent of it."""

    reasoning: Optional[ReasoningParser]
    tools: Optional[ToolParser]
    specs: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""  # the reply so far (``extend``)
    _reasoning: str = ""
    _content: str = ""
    _calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments) sent

    def extend(self, piece: str, final: bool) -> ReplyDelta:
        """``feed`` the reply so far plus ``piece``, the text of this step's tokens."""
        self.text += piece
        return self.feed(self.text, final)

    def feed(self, text: str, final: bool) -> ReplyDelta:
        """What ``text`` (the whole reply so far) adds to what was sent."""
        split = _split(self.reasoning, text, final)
        if final and self._reasoning and not (split.reasoning or "").startswith(self._reasoning):
            split = _split(self.reasoning, text, False)
        delta = ReplyDelta()
        delta.reasoning, self._reasoning = _grown(self._reasoning, split.reasoning)
        content = split.content
        if self.tools is not None and content is not None:
            parsed = self.tools.parse(content, final, self.specs)
            sent_content = self._content and not (parsed.content or "").startswith(self._content)
            if final and ((self._calls and not parsed.calls) or sent_content):
                parsed = self.tools.parse(content, False, self.specs)  # keep the stream's reading
            content = parsed.content
            self._call_deltas(parsed.calls, delta)
        delta.content, self._content = _grown(self._content, content)
        return delta

    def _call_deltas(self, calls: list[ParsedCall], delta: ReplyDelta) -> None:
        for index, call in enumerate(calls):
            if index < len(self._calls):
                name, sent = self._calls[index]
                if name != call.name:
                    return
                grown, now = _grown(sent, call.arguments)
                if grown:
                    delta.calls.append(CallDelta(index, None, grown))
                self._calls[index] = (name, now)
            elif index == len(self._calls):
                delta.calls.append(CallDelta(index, call.name, call.arguments))
                self._calls.append((call.name, call.arguments))

    @property
    def called(self) -> bool:
        """True once a call was sent."""
        return bool(self._calls)


def _grown(sent: str, now: Optional[str]) -> tuple[str, str]:
    """``(new tail, what is sent)`` when ``now`` extends ``sent``; nothing new otherwise."""
    if now is None or len(now) <= len(sent) or not now.startswith(sent):
        return "", sent
    return now[len(sent):], now
