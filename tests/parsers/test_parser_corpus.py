"""Our parsers against vLLM's on the parser corpus (corpus.json, whose ``vllm`` entries
tests/vllm_cpu/test_vllm_parser_corpus.py records from vLLM's own parsers): the same reasoning,
content and calls (names and parsed arguments) for each reply read whole, and read as it streams
token by token with a real tokenizer's token boundaries.

Streams are compared as vLLM's own streams read (which may differ from its whole readings); the
content of a stream is compared without surrounding blanks (vLLM streams the line breaks between
Qwen3's XML calls as content), and a call whose streamed arguments vLLM left unparseable is
compared by its name only.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest

from djl_handlers.parsers.registry import REASONING_PARSERS, TOOL_PARSERS, reasoning_parser, tool_parser
from djl_handlers.parsers.stream import ReplyStream, read_reply
from tests.parsers.tokens import corpus, pieces, tokenizer

DATA = corpus()


def _args(text: str) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return None


def _calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": c["name"], "arguments": _args(c["arguments"])} for c in calls]


def _parsers(case: dict[str, Any]) -> tuple[Any, Any]:
    if case["kind"] == "reasoning":
        return reasoning_parser(case["parser"]), None
    return None, tool_parser(case["parser"])


def _streamed(case: dict[str, Any]) -> dict[str, Any]:
    reasoning, tools = _parsers(case)
    stream = ReplyStream(reasoning, tools, DATA["tools"])
    tok = tokenizer(tuple(DATA["markers"][case["parser"]]))
    parts = pieces(tok, case["text"])
    got: dict[str, Any] = {"reasoning": "", "content": "", "calls": {}}
    text = ""
    for i, (delta_text, _) in enumerate(parts):
        text += delta_text
        delta = stream.feed(text, i == len(parts) - 1)
        got["reasoning"] += delta.reasoning
        got["content"] += delta.content
        for call in delta.calls:
            entry = got["calls"].setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.name or ""
            entry["arguments"] += call.arguments
    got["calls"] = [got["calls"][i] for i in sorted(got["calls"])]
    return got


def _none(value: Optional[str]) -> Optional[str]:
    return value.strip() or None if value is not None else None


CASES = [pytest.param(c, id=f"{c['parser']}-{i}") for i, c in enumerate(DATA["cases"])]


def test_the_corpus_covers_every_registered_parser() -> None:
    covered = {c["parser"] for c in DATA["cases"]}
    assert set(TOOL_PARSERS) - {"qwen3_json"} <= covered
    assert set(REASONING_PARSERS) - {"openai_gptoss"} <= covered  # vLLM reads harmony elsewhere
    assert all("vllm" in c for c in DATA["cases"]), "record vLLM's readings (tests/vllm_cpu)"


@pytest.mark.parametrize("case", CASES)
def test_whole_reply_reads_as_vllm_reads_it(case: dict[str, Any]) -> None:
    reasoning, tools = _parsers(case)
    reply = read_reply(case["text"], reasoning, tools, DATA["tools"])
    want = case["vllm"]["whole"]
    if case["kind"] == "reasoning":
        assert (reply.reasoning, reply.content) == (want["reasoning"], want["content"])
    else:
        got = [{"name": c.name, "arguments": c.arguments} for c in reply.calls]
        assert (reply.content, _calls(got)) == (want["content"], _calls(want["calls"]))


@pytest.mark.parametrize("case", CASES)
def test_streamed_reply_reads_as_vllm_streams_it(case: dict[str, Any]) -> None:
    got = _streamed(case)
    want = case["vllm"]["streamed"]
    if case["kind"] == "reasoning":
        assert (got["reasoning"] or None, _none(got["content"])) == (want["reasoning"], _none(want["content"]))
        return
    assert _none(got["content"]) == _none(want["content"])
    ours, theirs = _calls(got["calls"]), _calls(want["calls"])
    assert [c["name"] for c in ours] == [c["name"] for c in theirs]
    for mine, vllm in zip(ours, theirs, strict=True):
        if vllm["arguments"] is not None:
            assert mine["arguments"] == vllm["arguments"]


def _feed(case: dict[str, Any], pieces: list[str]) -> tuple[str, str, list[tuple[str, Any]]]:
    reasoning, tools = _parsers(case)
    stream = ReplyStream(reasoning, tools, DATA["tools"])
    got_reasoning, content, calls = "", "", {}
    for i in range(len(pieces)):
        delta = stream.extend(pieces[i], i == len(pieces) - 1)
        got_reasoning, content = got_reasoning + delta.reasoning, content + delta.content
        for call in delta.calls:
            name, args = calls.get(call.index, ("", ""))
            calls[call.index] = (name + (call.name or ""), args + call.arguments)
    return got_reasoning, content, [(n, _args(a)) for _, (n, a) in sorted(calls.items())]


@pytest.mark.parametrize("case", CASES)
def test_a_stream_reads_the_same_whatever_its_token_boundaries(case: dict[str, Any]) -> None:
    tok = tokenizer(tuple(DATA["markers"][case["parser"]]))
    by_token = _feed(case, [text for text, _ in pieces(tok, case["text"])])
    by_char = _feed(case, list(case["text"]))
    assert by_char == by_token
