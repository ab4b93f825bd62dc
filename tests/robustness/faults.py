"""Fault-injection scenarios run in-process on the fake engine.

Each :class:`Scenario` builds a service, injects one kind of fault (a request's engine error via
``<fail@N>``, a whole-step crash via ``<crash>``, a ``MemoryError``, an engine that refuses a request,
a tokenizer that raises, a ``release`` that raises, client cancellation) and returns the list of
problems it saw — empty when only the requests hit by the fault failed, each with an explicit error
record, and everything else finished with exactly the expected text. Shared by
``test_faults_inprocess.py`` and ``benchmarks/robustness.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.fake import REPLY, FakeEngine
from djl_handlers.io import Input
from djl_handlers.testing.java_loop import DriverRequest, RollingBatchDriver, json_request
from tests.robustness.harness import make_service

Problems = list[str]


@dataclass(frozen=True)
class Scenario:
    """One fault scenario: ``run()`` returns its problems; ``faults`` is how many it injects."""

    name: str
    run: Callable[[], Problems]
    faults: int = 1
    known_bug: Optional[str] = None


def _driver(engine: Optional[FakeEngine] = None) -> tuple[RollingBatchDriver, FakeEngine]:
    service, fake = make_service("huggingface", {"rolling_batch": "auto"}, engine)
    return RollingBatchDriver(service.handle), fake


def _submit(driver: RollingBatchDriver, prompt: str, n: int, stream: bool = False) -> DriverRequest:
    body: dict[str, Any] = {"inputs": prompt, "parameters": {"max_new_tokens": n}}
    if stream:
        body["stream"] = True
    return driver.submit(json_request(body))


def _expect_text(req: DriverRequest, n: int, label: str) -> Problems:
    if req.code is not None:
        return [f"{label}: failed with {req.code} {req.error!r}"]
    lines = req.text.splitlines()
    try:
        text = json.loads(lines[-1])["generated_text"] if lines else None
    except (ValueError, KeyError):
        text = None
    return [] if text == REPLY[:n] else [f"{label}: got {req.text[:80]!r}"]


def _expect_error(req: DriverRequest, code: int, needle: str, label: str) -> Problems:
    if not req.done or req.code != code or needle not in (req.error or ""):
        return [f"{label}: expected {code} with {needle!r}, got {req.code} {req.error!r}"]
    return []


def _expect_stream_error(req: DriverRequest, code: int, needle: str, lines: int) -> Problems:
    """A jsonlines stream that failed after ``lines`` token lines: those, then one closing line
    carrying ``error`` and ``code`` (no error record: the status was already 200)."""
    if not req.done or req.code is not None or len(req.chunks) != lines + 1:
        return [f"failing stream: expected {lines} lines then an error line, got {req.code} {req.chunks!r}"]
    last = json.loads(req.chunks[-1])
    if last.get("code") != code or needle not in str(last.get("error")):
        return [f"failing stream: last line {req.chunks[-1]!r}"]
    return []


def _expect_idle(driver: RollingBatchDriver, engine: FakeEngine) -> Problems:
    problems = []
    if driver.active:
        problems.append(f"{len(driver.active)} requests still active")
    if engine.has_unfinished():
        problems.append(f"{len(engine._rows)} rows left in the engine")  # noqa: SLF001
    return problems


def _run(driver: RollingBatchDriver) -> Problems:
    try:
        driver.run(max_steps=driver.steps + 500)
    except Exception as exc:  # noqa: BLE001 - reported as the problem
        return [f"exception escaped the handler: {exc!r}"]
    return []


# ------------------------------------------------------------------------------------------------
# rolling batch


def fail_one(at: int, position: int, stream: bool) -> Problems:
    """Four requests; the one at ``position`` fails at its ``at``-th token."""
    driver, engine = _driver()
    reqs = []
    for i in range(4):
        prompt = f"p{i} <fail@{at}>" if i == position else f"p{i}"
        reqs.append(_submit(driver, prompt, 6, stream=stream and i == position))
    problems = _run(driver)
    for i, req in enumerate(reqs):
        if i == position and stream and at > 1:  # data was sent: the error is the stream's last line
            problems += _expect_stream_error(req, 424, f"fake failure at token {at}", at - 1)
        elif i == position:
            problems += _expect_error(req, 424, f"fake failure at token {at}", "failing request")
        else:
            problems += _expect_text(req, 6, f"neighbour {i}")
    return problems + _expect_idle(driver, engine)


def crash_mid_flight() -> Problems:
    """Three requests decoding; a ``<crash>`` request joins: the step fails, so do its members,
    explicitly; a malformed request in the same step keeps its own 400; later requests succeed."""
    driver, engine = _driver()
    early = [_submit(driver, f"early {i}", 20) for i in range(3)]
    driver.step()
    driver.step()
    crash = _submit(driver, "boom <crash>", 5)
    bad = driver.submit(DriverRequest(b"{broken", {"Content-Type": "application/json"}))
    problems = _run(driver)
    for i, req in enumerate([*early, crash]):
        problems += _expect_error(req, 424, "engine step failed", f"in-flight {i}")
    problems += _expect_error(bad, 400, "JSON", "malformed request")
    problems += [f"in-flight {i} got a partial body {r.text!r}" for i, r in enumerate(early) if r.chunks]
    later = [_submit(driver, f"later {i}", 3 + i) for i in range(3)]
    problems += _run(driver)
    for i, req in enumerate(later):
        problems += _expect_text(req, 3 + i, f"later {i}")
    return problems + _expect_idle(driver, engine)


class _FlakyEngine(FakeEngine):
    """Raises ``error`` from ``step`` number ``at``; refuses prompts with ``<reject>``; optionally
    has a tokenizer that fails on ``<badtok>`` and a ``release`` that always raises."""

    def __init__(self, error: Optional[BaseException] = None, at: int = 0, bad_release: bool = False) -> None:
        super().__init__()
        self.error, self.at, self.bad_release = error, at, bad_release
        base_encode = self.tokenizer.encode

        def encode(text: str, add_special_tokens: bool = True) -> list[int]:
            if "<badtok>" in text:
                raise ValueError("tokenizer cannot handle this text")
            return base_encode(text, add_special_tokens)

        self.tokenizer.encode = encode  # type: ignore[method-assign]

    def add_request(self, request: EngineRequest) -> None:
        if "<reject>" in request.prompt:
            raise RuntimeError("engine refused the request")
        super().add_request(request)

    def step(self) -> list[StepOutput]:
        if self.error is not None and self.steps + 1 == self.at:
            self.steps += 1
            raise self.error
        outputs = super().step()
        return outputs + [StepOutput(10**9, token_id=65)]  # an output for a request nobody has

    def release(self, request_id: int) -> None:
        super().release(request_id)
        if self.bad_release:
            raise RuntimeError("release failed")


def memory_error_step() -> Problems:
    """A ``MemoryError`` from the second step: its members get 507, the next request succeeds."""
    engine = _FlakyEngine(MemoryError("out of memory"), at=2)
    driver, _ = _driver(engine)
    reqs = [_submit(driver, f"m{i}", 8) for i in range(3)]
    problems = _run(driver)
    problems += [p for i, r in enumerate(reqs) for p in _expect_error(r, 507, "out of memory", f"member {i}")]
    after = _submit(driver, "after", 4)
    problems += _run(driver) + _expect_text(after, 4, "after the OOM")
    return problems + _expect_idle(driver, engine)


def refused_and_untokenizable() -> Problems:
    """The engine refuses one request and the tokenizer fails on another: only those two fail."""
    engine = _FlakyEngine()
    driver, _ = _driver(engine)
    good = [_submit(driver, "g0", 5), _submit(driver, "g1", 7)]
    refused = _submit(driver, "x <reject>", 5)
    untokenizable = _submit(driver, "y <badtok>", 5)
    good.append(_submit(driver, "g2", 3))
    problems = _run(driver)
    problems += _expect_error(refused, 424, "refused", "refused request")
    problems += _expect_error(untokenizable, 424, "tokenizer", "untokenizable request")
    for req, n in zip(good, (5, 7, 3), strict=True):
        problems += _expect_text(req, n, "good request")
    return problems + _expect_idle(driver, engine)


def release_raises() -> Problems:
    """``engine.release`` raising must not break the batch or the answers."""
    engine = _FlakyEngine(bad_release=True)
    driver, _ = _driver(engine)
    reqs = [_submit(driver, f"r{i}", 2 + i) for i in range(4)]
    problems = _run(driver)
    for i, req in enumerate(reqs):
        problems += _expect_text(req, 2 + i, f"request {i}")
    return problems


def cancel_many() -> Problems:
    """Six requests; three clients go away after two steps: their slots are free one step later,
    the other three finish with their full text, and new requests can join."""
    driver, engine = _driver()
    reqs = [_submit(driver, f"c{i}", 40, stream=i % 2 == 0) for i in range(6)]
    driver.step()
    driver.step()
    gone = reqs[::2]
    for req in gone:
        req.cancel = True
    driver.step()
    problems = [f"cancelled request {i} not finished after one step" for i, r in enumerate(gone) if not r.done]
    rows = len(engine._rows)  # noqa: SLF001
    if rows != 3:
        problems.append(f"{rows} rows in the engine one step after cancelling 3 of 6, expected 3")
    problems += [f"cancelled request {i} got an error record" for i, r in enumerate(gone) if r.code is not None]
    newcomer = _submit(driver, "new", 5)
    problems += _run(driver)
    for req in reqs[1::2]:
        problems += _expect_text(req, 40, "kept request")
    problems += _expect_text(newcomer, 5, "newcomer")
    return problems + _expect_idle(driver, engine)


# ------------------------------------------------------------------------------------------------
# dynamic batch (engines without generate_static use the step loop: vLLM, TensorRT-LLM)


class _StepOnlyEngine(FakeEngine):
    """The fake engine without ``generate_static``, like the vLLM and TensorRT-LLM adapters."""

    generate_static = None  # type: ignore[assignment]


def _dynamic(engine: FakeEngine, prompts: Sequence[str], n: int = 4) -> list[Any]:
    service, _ = make_service("huggingface", {"rolling_batch": "disable"}, engine)
    props = {"batch_size": str(len(prompts))}
    content: list[tuple[Optional[str], bytes]] = []
    for i, prompt in enumerate(prompts):
        props[f"batch_{i:03d}.Content-Type"] = "application/json"
        content.append((f"batch_{i:03d}.data", json.dumps({"inputs": prompt,
                                                           "parameters": {"max_new_tokens": n}}).encode()))
    out = service.handle(Input.from_parts(props, content))
    return [json.loads(bytes(out.content.value_at(i))) for i in range(out.content.size())]


def dynamic_fail_one() -> Problems:
    """Step-loop dynamic batch: one request fails at token 2, the other two finish."""
    engine = _StepOnlyEngine()
    results = _dynamic(engine, ["a", "b <fail@2>", "c"])
    problems = [f"request {i} got {results[i]!r}" for i in (0, 2) if results[i] != [{"generated_text": REPLY[:4]}]]
    if not (isinstance(results[1], dict) and results[1].get("code") == 424 and "fake failure" in results[1]["error"]):
        problems.append(f"failing request got {results[1]!r}")
    if engine.has_unfinished():
        problems.append("rows left in the engine")
    return problems


def dynamic_crash_then_recover() -> Problems:
    """Step-loop dynamic batch: a whole-step crash fails that batch; the next batch must succeed."""
    engine = _StepOnlyEngine()
    first = _dynamic(engine, ["a", "<crash>"])
    problems = [f"crashed batch member {i} got {r!r}" for i, r in enumerate(first)
                if not (isinstance(r, dict) and r.get("code") == 424)]
    if engine.has_unfinished():
        problems.append(f"{len(engine._rows)} rows left in the engine after the crash")  # noqa: SLF001
    second = _dynamic(engine, ["b"])
    if second != [[{"generated_text": REPLY[:4]}]]:
        problems.append(f"the next batch got {second!r}")
    return problems




def scenarios() -> list[Scenario]:
    """Every scenario, with the number of faults each injects."""
    found = [Scenario(f"fail@{at}-pos{pos}-{'stream' if stream else 'json'}",
                      lambda at=at, pos=pos, stream=stream: fail_one(at, pos, stream))
             for at in (1, 2, 5) for pos in (0, 3) for stream in (False, True)]
    found += [
        Scenario("crash-mid-flight", crash_mid_flight, faults=2),
        Scenario("memory-error-step", memory_error_step),
        Scenario("refused-and-untokenizable", refused_and_untokenizable, faults=2),
        Scenario("release-raises", release_raises, faults=4),
        Scenario("cancel-3-of-6", cancel_many, faults=3),
        Scenario("dynamic-fail-one", dynamic_fail_one),
        Scenario("dynamic-crash-then-recover", dynamic_crash_then_recover),
    ]
    return found
