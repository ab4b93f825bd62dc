"""Run corpus cases through ``InferenceService`` in-process and judge the outcome.

Each case is sent in a batch between two good requests ("neighbours"), in rolling-batch mode
through DJL's Java-loop emulator (``RollingBatchDriver``) and in dynamic-batch mode as one batch
``Input``. :func:`judge_rolling` / :func:`judge_dynamic` return the list of problems (empty when the
case got exactly the outcome the corpus asks for). The tests and ``benchmarks/robustness.py`` share
this module.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.engines.fake import REPLY, ByteTokenizer, FakeEngine
from djl_handlers.io import Input
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import DriverRequest, RollingBatchDriver, json_request
from tests.robustness.corpus import Case

GOOD_JSON: dict[str, Any] = {"inputs": "neighbour one", "parameters": {"max_new_tokens": 5}}
GOOD_STREAM: dict[str, Any] = {"inputs": "neighbour two", "stream": True, "parameters": {"max_new_tokens": 4}}
MAX_STEPS = 3000


class ChatTokenizer(ByteTokenizer):
    """The fake engine's tokenizer plus a trivial chat template, so chat bodies get past it."""

    chat_template = "fake"

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        """``<role>content`` per message, then ``<assistant>``."""
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def make_engine() -> FakeEngine:
    """A fake engine with a chat template."""
    engine = FakeEngine()
    engine.tokenizer = ChatTokenizer()
    return engine


def make_service(engine_name: str, options: dict[str, str], engine: Optional[FakeEngine] = None,
                 ) -> tuple[InferenceService, FakeEngine]:
    """An initialised service for ``engine_name`` (parameter set) backed by the fake engine."""
    fake = engine or make_engine()
    service = InferenceService(engine_name, engine_factory=lambda config: fake)
    assert service.handle(Input.from_parts(dict(options), ())) is None
    return service, fake


# ------------------------------------------------------------------------------------------------
# neighbours


def check_good_json(code: Optional[int], text: str) -> list[str]:
    """The first neighbour: plain JSON, five tokens."""
    if code is not None:
        return [f"good json neighbour failed with {code}"]
    try:
        body = json.loads(text)
    except ValueError:
        return [f"good json neighbour body is not JSON: {text[:80]!r}"]
    return [] if body == {"generated_text": REPLY[:5]} else [f"good json neighbour got {body!r}"]


def check_good_stream(code: Optional[int], text: str) -> list[str]:
    """The second neighbour: jsonlines, four token lines, the last with generated_text."""
    if code is not None:
        return [f"good stream neighbour failed with {code}"]
    try:
        lines = [json.loads(line) for line in text.splitlines()]
    except ValueError:
        return [f"good stream neighbour line is not JSON: {text[:80]!r}"]
    tokens = "".join(line["token"]["text"] for line in lines)
    if len(lines) != 4 or tokens != REPLY[:4] or lines[-1].get("generated_text") != REPLY[:4]:
        return [f"good stream neighbour got {text!r}"]
    return []


# ------------------------------------------------------------------------------------------------
# judging one outcome


def _jsonable(message: str) -> bool:
    try:
        json.dumps({"error": message}, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError):
        return False
    return True


def check_error(case: Case, code: Optional[int], message: Optional[str]) -> list[str]:
    """A bad case: its own 4xx with the expected code and a message that names the problem."""
    problems: list[str] = []
    if code is None:
        return [f"expected {case.status}, the request succeeded"]
    if code != case.status or not 400 <= code < 500:
        problems.append(f"expected code {case.status}, got {code}: {message!r}")
    text = message or ""
    if not text.strip():
        problems.append("error message is empty")
    elif not _jsonable(text):
        problems.append("error message cannot be encoded as UTF-8 JSON")
    missing = [m for m in case.mentions if m.lower() not in text.lower()]
    if missing:
        problems.append(f"message {text[:160]!r} does not mention {missing}")
    return problems


def _generated_text(text: str, content_type: str) -> Optional[str]:
    if content_type == "application/json":
        body = json.loads(text)
        return body.get("generated_text") if isinstance(body, dict) else None
    if content_type == "application/jsonlines":
        last = json.loads(text.splitlines()[-1])
        return last.get("generated_text") if isinstance(last, dict) else None
    return None


def check_success(case: Case, code: Optional[int], text: str, content_type: str) -> list[str]:
    """A good case: no error, a non-empty body, and the exact text when the case names it."""
    if code is not None:
        return [f"expected success, got {code}"]
    if not text:
        return ["expected success, the body is empty"]
    if case.expect_text is None:
        return []
    try:
        got = _generated_text(text, content_type)
    except (ValueError, IndexError):
        return [f"body is not {content_type}: {text[:80]!r}"]
    if got != case.expect_text:
        return [f"expected text {case.expect_text[:40]!r}, got {str(got)[:40]!r}"]
    return []


# ------------------------------------------------------------------------------------------------
# rolling batch


@dataclass
class RollingOutcome:
    """What the Java-loop emulator saw for the bad request and its neighbours."""

    bad: DriverRequest
    neighbours: list[DriverRequest]
    escaped: Optional[BaseException] = None
    leaked_rows: int = 0
    problems: list[str] = field(default_factory=list)


def case_request(case: Case) -> DriverRequest:
    """The driver request for a case (body + properties)."""
    return DriverRequest(case.body, case.properties())


def run_rolling(cases: Sequence[Case], engine_name: str = "huggingface") -> list[RollingOutcome]:
    """All ``cases`` in one rolling batch, each between two good neighbours; run to completion."""
    service, engine = make_service(engine_name, {"rolling_batch": "auto"})
    driver = RollingBatchDriver(service.handle)
    outcomes = []
    for case in cases:
        first = driver.submit(json_request(GOOD_JSON))
        bad = driver.submit(case_request(case))
        second = driver.submit(json_request(GOOD_STREAM))
        outcomes.append(RollingOutcome(bad, [first, second]))
    escaped: Optional[BaseException] = None
    try:
        driver.run(max_steps=MAX_STEPS)
    except Exception as exc:  # noqa: BLE001 - the test reports it
        escaped = exc
    leaked = len(engine._rows)  # noqa: SLF001 - the fake engine's in-flight rows
    for case, outcome in zip(cases, outcomes, strict=True):
        outcome.escaped, outcome.leaked_rows = escaped, leaked
        outcome.problems = judge_rolling(case, outcome)
    return outcomes


def lost_in_rolling(case: Case, outcome: RollingOutcome) -> int:
    """Requests (of 3) that did not get their correct outcome."""
    if outcome.escaped is not None:
        return 3
    first, second = outcome.neighbours
    case_ok = not (check_success(case, outcome.bad.code, outcome.bad.text, outcome.bad.headers.get("Content-Type", ""))
                   if case.ok else check_error(case, outcome.bad.code, outcome.bad.error)) and outcome.bad.done
    return (int(not case_ok) + int(bool(check_good_json(first.code, first.text)))
            + int(bool(check_good_stream(second.code, second.text))))


def judge_rolling(case: Case, outcome: RollingOutcome) -> list[str]:
    """Problems with one rolling outcome (empty list: as expected)."""
    if outcome.escaped is not None:
        return [f"exception escaped the handler: {outcome.escaped!r}"[:300]]
    bad = outcome.bad
    problems = [] if bad.done else ["the request never finished"]
    if case.ok:
        problems += check_success(case, bad.code, bad.text, bad.headers.get("Content-Type", ""))
    else:
        problems += check_error(case, bad.code, bad.error)
        if bad.text:
            problems.append(f"an error record also carried data {bad.text[:60]!r}")
    first, second = outcome.neighbours
    problems += check_good_json(first.code, first.text) + check_good_stream(second.code, second.text)
    if outcome.leaked_rows:
        problems.append(f"{outcome.leaked_rows} requests left in the engine")
    return problems


# ------------------------------------------------------------------------------------------------
# dynamic batch


def _dynamic_input(items: Sequence[tuple[bytes, dict[str, str]]]) -> Input:
    props = {"batch_size": str(len(items))}
    content: list[tuple[Optional[str], bytes]] = []
    for i, (body, properties) in enumerate(items):
        prefix = f"batch_{i:03d}."
        props.update({prefix + k: v for k, v in properties.items()})
        content.append((prefix + "data", body))
    return Input.from_parts(props, content)


@dataclass
class DynamicOutcome:
    """Problems of the case itself and of its two neighbours in one dynamic batch."""

    case_problems: list[str] = field(default_factory=list)
    neighbour_problems: list[str] = field(default_factory=list)
    escaped: Optional[BaseException] = None

    @property
    def problems(self) -> list[str]:
        """Everything that went wrong."""
        if self.escaped is not None:
            return [f"exception escaped the handler: {self.escaped!r}"[:300]]
        return self.case_problems + self.neighbour_problems

    @property
    def lost(self) -> int:
        """Requests (of 3) that did not get their correct outcome."""
        if self.escaped is not None:
            return 3
        return int(bool(self.case_problems)) + len(self.neighbour_problems)


def dynamic_outcome(case: Case) -> DynamicOutcome:
    """One dynamic batch ``[good, case, good]``, judged."""
    service, engine = make_service(case.engine, {"rolling_batch": "disable"})
    good = (json.dumps(GOOD_JSON).encode(), {"Content-Type": "application/json"})
    try:
        out = service.handle(_dynamic_input([good, (case.body, case.properties()), good]))
    except Exception as exc:  # noqa: BLE001 - reported as the problem
        return DynamicOutcome(escaped=exc)
    if out.content.size() != 3:
        return DynamicOutcome(escaped=RuntimeError(f"expected 3 results, got {out.content.size()} ({out.code})"))
    results = [json.loads(bytes(out.content.value_at(i))) for i in range(3)]
    outcome = DynamicOutcome(judge_dynamic(case, results[1]))
    outcome.neighbour_problems = [f"neighbour {i} got {results[i]!r}" for i in (0, 2)
                                  if results[i] != [{"generated_text": REPLY[:5]}]]
    if engine._rows:  # noqa: SLF001
        outcome.case_problems.append(f"{len(engine._rows)} requests left in the engine")  # noqa: SLF001
    return outcome


def run_dynamic(case: Case) -> list[str]:
    """One dynamic batch ``[good, case, good]``; the problems found (empty: as expected)."""
    return dynamic_outcome(case).problems


def judge_dynamic(case: Case, result: Any) -> list[str]:
    """Problems with the dynamic-batch body of the case."""
    if case.ok:
        if isinstance(result, dict) and result.get("object") in ("chat.completion", "text_completion"):
            return [] if result.get("choices") else [f"OpenAI answer without choices: {result!r}"[:200]]
        if not isinstance(result, list) or not result or not all("generated_text" in r for r in result):
            return [f"expected a list of generated_text, got {result!r}"[:200]]
        if case.expect_text is not None and any(r["generated_text"] != case.expect_text for r in result):
            return [f"expected text {case.expect_text[:40]!r}, got {result!r}"[:200]]
        return []
    if not isinstance(result, dict):
        return [f"expected an error body, got {result!r}"[:200]]
    problems = check_error(case, result.get("code"), result.get("error"))
    if result.get("type") in (None, ""):
        problems.append("error body has no type")
    return problems
