"""Golden files lock the exact bytes of every formatter on a set of step-by-step scenarios.

Each scenario is a sequence of scheduler steps (tokens added per step, possibly none, possibly
several); the formatter is called once per step and the concatenated body is compared with
``tests/golden/formatting/<format>/<scenario>.txt``. Regenerate after a deliberate change with
``UPDATE_GOLDEN=1`` and review the diff. ``docs/schema.md`` embeds some goldens verbatim and a
test here keeps it in sync.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import pytest

from djl_handlers.dialects.openai.state import OpenAIState
from djl_handlers.dialects.registry import get_formatter
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.request.records import Request, RequestOutput, ResponseOptions, Token

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "formatting"
SCHEMA_DOC = ROOT / "docs" / "schema.md"

FORMATS = [
    "json",
    "jsonlines",
    "none",
    "sse",
    "tgi",
    "tgi_stream",
    "3p",
    "3p_stream",
    "chat_json",
    "chat_sse",
    "completion_json",
    "completion_sse",
    "json_chat",
    "jsonlines_chat",
]
OPENAI_ID, OPENAI_CREATED, OPENAI_MODEL = "cmpl-0001", 1700000000, "smollm2"


@dataclass
class Scenario:
    """A request and its step-by-step generation."""

    steps: list[list[Token]]
    finish_reason: str
    prompt: str = "What is Deep Learning?"
    details: bool = False
    return_full_text: bool = False
    error: Optional[str] = None
    error_code: Optional[int] = None
    options: dict[str, Any] = field(default_factory=dict)  # ResponseOptions fields
    seed: Optional[int] = None


T = Token
SCENARIOS: dict[str, Scenario] = {
    "basic": Scenario(
        steps=[
            [T(304, "Deep", -0.05)],
            [T(11157, " Learning", -1.25), T(278, " is", -0.0078125)],
            [],
            [T(5972, " fun.", -0.5)],
        ],
        finish_reason="length",
    ),
    "details": Scenario(
        steps=[[T(304, "Deep", -0.05)], [T(11157, " Learning", -1.25)], [T(278, " is", -0.0078125)]],
        finish_reason="length",
        details=True,
        seed=42,
    ),
    "full_text_escape": Scenario(
        steps=[[T(7, 'Un "café"', -0.25)], [T(8, "\n\t🙂", 0.0)], [T(9, " \\o/", None)]],
        finish_reason="eos_token",
        prompt='Say "hi"\n\tto \\ me: ',
        details=True,
        return_full_text=True,
    ),
    "single_token": Scenario(steps=[[T(42, "Yes", -0.125)]], finish_reason="eos_token", details=True),
    "stop_trimmed": Scenario(
        steps=[[T(11, "One", -0.5)], [T(12, " two", -0.25)], []],
        finish_reason="stop_sequence",
        details=True,
    ),
    "error": Scenario(
        steps=[[T(11, "One", -0.5)], []],
        finish_reason="error",
        error="engine failed: out of blocks",
        error_code=424,
    ),
    "openai_options": Scenario(
        steps=[[T(304, "Deep", -0.05)], [T(11157, " Learning", -1.25), T(278, " is", -0.0078125)]],
        finish_reason="eos_token",
        options={"logprobs": True, "top_logprobs": 1, "include_usage": True},
    ),
}
CASES = [(f, s) for f in FORMATS for s in SCENARIOS if s != "openai_options"] + [
    (f, "openai_options") for f in ("chat_json", "chat_sse", "json_chat", "jsonlines_chat")
]


# Several samples (n/best_of): per sample, its tokens per step (a sample ends on its last step).
SAMPLE_FORMATS = ["json", "tgi", "chat_json", "chat_sse", "completion_json", "completion_sse"]
SAMPLE_STEPS = [
    [[T(304, "Deep", -0.5)], [T(11157, " Learning", -1.25)], [T(278, " is", -0.25)]],
    [[T(7, "Yes", -0.125)], [T(2, "", -0.0625)]],
]
SAMPLE_REASONS = ["length", "eos_token"]
CASES += [(f, "samples") for f in SAMPLE_FORMATS]


def run_sample_steps(name: str) -> list[str]:
    """A two-sample request (``n: 2``) through a formatter, one chunk per step; sample 1 finishes
    first and has the higher cumulative log-prob."""
    fmt = get_formatter(name, stream=False)
    params = GenerationParameters(details=True, do_sample=True, n=2, seed=42)
    out = build_output(replace(SCENARIOS["details"], prompt="Is it deep?"))
    out.request = replace(out.request, params=params)
    out.sequences = [RequestOutput(request=replace(out.request, seed=42 + i, formatter_state=None))
                     for i in range(2)]
    chunks = []
    for step in range(max(len(s) for s in SAMPLE_STEPS)):
        for seq, steps, reason in zip(out.sequences, SAMPLE_STEPS, SAMPLE_REASONS, strict=True):
            seq.new_tokens = list(steps[step]) if step < len(steps) else []
            seq.tokens.extend(seq.new_tokens)
            if step == len(steps) - 1:
                seq.finished, seq.finish_reason = True, reason
        if all(seq.finished for seq in out.sequences):
            out.finished, out.finish_reason = True, "eos_token"
        chunks.append(fmt(out))
    return chunks


def build_output(sc: Scenario) -> RequestOutput:
    """A fresh RequestOutput for a scenario (no tokens yet)."""
    params = GenerationParameters(details=sc.details, return_full_text=sc.return_full_text)
    options = ResponseOptions(**{"model": OPENAI_MODEL, **sc.options})
    state = OpenAIState(response_id=OPENAI_ID, created=OPENAI_CREATED)
    request = Request(prompt=sc.prompt, params=params, inputs=sc.prompt, seed=sc.seed, response_options=options,
                      formatter_state=state)
    return RequestOutput(request=request, prompt_tokens=len(sc.prompt.split()))


def run_steps(name: str, sc: Scenario) -> list[str]:
    """Drive a formatter through a scenario like the scheduler does; one chunk per step."""
    fmt = get_formatter(name, stream=False)
    out = build_output(sc)
    chunks = []
    for i, step in enumerate(sc.steps):
        out.new_tokens = list(step)
        out.tokens.extend(step)
        if i == len(sc.steps) - 1:
            out.finished = True
            out.finish_reason = sc.finish_reason
            out.error = sc.error
            out.error_code = sc.error_code
        chunks.append(fmt(out))
    return chunks


def golden_path(fmt: str, scenario: str) -> Path:
    """Where a golden body lives."""
    return GOLDEN / fmt / f"{scenario}.txt"


def read_golden(fmt: str, scenario: str) -> str:
    """The golden bytes, decoded as UTF-8 without newline translation."""
    return golden_path(fmt, scenario).read_bytes().decode("utf-8")


@pytest.mark.parametrize(("fmt", "scenario"), CASES)
def test_golden_bytes(fmt: str, scenario: str) -> None:
    body = "".join(run_sample_steps(fmt) if scenario == "samples" else run_steps(fmt, SCENARIOS[scenario]))
    path = golden_path(fmt, scenario)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body.encode("utf-8"))
    assert body == read_golden(fmt, scenario)


def test_every_golden_file_is_exercised() -> None:
    expected = {golden_path(f, s) for f, s in CASES}
    present = set(GOLDEN.glob("*/*.txt"))
    assert present == expected


# docs/schema.md quotes goldens between markers; UPDATE_GOLDEN=1 refreshes the quoted blocks.
DOC_BLOCK = re.compile(r"<!-- golden: (\S+)/(\S+) -->\n```\n(.*?)```\n<!-- /golden -->", re.DOTALL)
REQUIRED_DOC_FORMATS = set(FORMATS) - {"json_chat"}  # json_chat = chat_json with spaced separators


def fenced(text: str) -> str:
    """A golden body as it appears inside a fenced block."""
    return text if text.endswith("\n") else text + "\n"


def refresh_schema_doc(doc: str) -> str:
    """``doc`` with every golden block replaced by the current golden bytes."""

    def replace(match: re.Match[str]) -> str:
        fmt, scenario = match.group(1), match.group(2)
        body = fenced(read_golden(fmt, scenario))
        return f"<!-- golden: {fmt}/{scenario} -->\n```\n{body}```\n<!-- /golden -->"

    return DOC_BLOCK.sub(replace, doc)


def test_schema_doc_quotes_goldens_verbatim() -> None:
    doc = SCHEMA_DOC.read_text(encoding="utf-8")
    if os.environ.get("UPDATE_GOLDEN") == "1":
        doc = refresh_schema_doc(doc)
        SCHEMA_DOC.write_text(doc, encoding="utf-8")
    blocks = DOC_BLOCK.findall(doc)
    assert {fmt for fmt, _, _ in blocks} >= REQUIRED_DOC_FORMATS
    for fmt, scenario, quoted in blocks:
        assert quoted == fenced(read_golden(fmt, scenario)), f"docs/schema.md example {fmt}/{scenario}"
