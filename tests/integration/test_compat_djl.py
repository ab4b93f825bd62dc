"""The same model directories on DJL Serving's real ModelServer and on ``djl-handlers serve``.

Part 1 (black box): every case of ``compat_cases.py`` is sent to both servers and the status,
Content-Type and body must match (bytes, or parsed JSON where ``docs/compatibility.md`` lists a
deliberate byte difference). DJL side: ``DjlServer``, DJL Serving 0.34's real
``ai.djl.serving.ModelServer`` (tests/djl_serving/djl_server.py, docs/djl-serving.md). Our side:
``djl-handlers serve DIR --port P`` as a subprocess. One pair of servers per model directory,
started once and stopped before the next model's pair. Cases in ``RESOLVER_PENDING`` are
xfail(strict=False) until the package mirrors DJL's LmiConfigRecommender.

Part 2 (handler level): identical Input frames read by DJL's own ``djl_python.inputs.Input`` and by
ours go through ``djl_handlers.huggingface``'s service; given DJL's Input the handler must return
DJL's ``Output`` class, and both Outputs must carry the same properties and content and send the
same bytes.

``COMPAT_CAPTURE=/path/file.json`` writes every captured reply (used for docs/compatibility.md).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import httpx
import pytest
from compat_cases import (
    CASES,
    DIFFERENCES,
    MODELS,
    RESOLVER_PENDING,
    Case,
    Reply,
    comparable,
    materialize,
    run_case,
)
from conftest_models import embedded_dir, tiny_dir, tiny_model  # noqa: F401
from djl_server_fixture import DEFAULT_VERSION, DjlServer, DjlServerError, djl_skip_reason, free_port

from djl_handlers.io import Input, Output, wire
from djl_handlers.testing.sockets import received_input as _read
from djl_handlers.testing.sockets import sent_bytes as _sent

pytestmark = [pytest.mark.djl]

ROOT = Path(__file__).resolve().parents[2]
DJL_PYTHON = ROOT / "tests" / "djl_serving" / "lib" / "python"
SEED_BUG = (
    "djl_handlers/request/parser.py _server_seed: DJL's Java RollingBatch sends a request's random "
    "seed as content 'seed' = String.valueOf(Random.nextInt()), negative half the time; the parser "
    "turns it into parameters.seed and GenerationParameters rejects it (400 'parameters.seed must be "
    "an integer in [0, 18446744073709551615], got -1252582975') for requests that sent no seed"
)
FORMATTER_BUG = (
    "djl_handlers service/config: with a model.py holding @output_formatter/@input_formatter, DJL's "
    "python_sync_engine puts the functions themselves into the properties ('output_formatter', "
    "'input_formatter'), init included; InferenceService.initialize stringifies the callable and "
    "fails: ConfigError unknown output_formatter '<function ...>', so the model never loads on DJL"
)


# =========================================================================== known-bug probes
def negative_seed_rejected() -> bool:
    """True while our parser turns DJL's negative rolling-batch seed into a 400."""
    from djl_handlers.dialects.dispatch import parse_request
    from djl_handlers.errors import DjlHandlersError
    from djl_handlers.request.parser import ParserSettings

    item = Input.from_parts(
        {"Content-Type": "application/json"},
        [("data", b'{"inputs": "a", "parameters": {"max_new_tokens": 1}}'), ("seed", b"-1252582975")],
    )
    try:
        parse_request(item, ParserSettings(engine="huggingface", rolling_batch=True))
    except DjlHandlersError:
        return True
    return False


# =========================================================================== our server
class OurServer:
    """``djl-handlers serve MODEL_DIR --port P`` in its own session (killed as a group)."""

    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.model_dir = model_dir
        self.port = free_port()
        self.log_path = log_path
        self.startup_seconds: Optional[float] = None
        self._proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        script = Path(sys.executable).with_name("djl-handlers")
        head = (
            [str(script)]
            if script.is_file()
            else [sys.executable, "-c", "import sys; from djl_handlers.cli import main; sys.exit(main())"]
        )
        return [*head, "serve", str(self.model_dir), "--port", str(self.port)]

    def start(self, timeout: float = 240.0) -> OurServer:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        for key in ("HF_MODEL_ID", "OPTION_MODEL_ID"):
            env.pop(key, None)
        env["DJL_HANDLERS_DJL_RULES"] = DEFAULT_VERSION  # the rules of the DJL release it is compared with
        begin = time.monotonic()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT), start_new_session=True
            )
        while time.monotonic() - begin < timeout:
            if self._proc.poll() is not None:
                raise RuntimeError(f"djl-handlers serve exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/ping", timeout=2) as resp:
                    if resp.status == 200:
                        self.startup_seconds = time.monotonic() - begin
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"djl-handlers serve not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue


# =========================================================================== server pairs
class Pair:
    """Both servers for one model directory; DJL's start error is kept, not retried."""

    def __init__(self, model: str, model_dir: Path, logs: Path) -> None:
        self.model = model
        self.ours = OurServer(model_dir, logs / f"ours-{model}.log")
        self.djl: Optional[DjlServer] = None
        self.djl_error: Optional[BaseException] = None
        ours_error: list[BaseException] = []

        def start_ours() -> None:
            try:
                self.ours.start()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                ours_error.append(exc)

        thread = threading.Thread(target=start_ours)
        thread.start()
        try:
            self.djl = DjlServer(model_dir).start()
        except DjlServerError as exc:
            self.djl_error = exc
        thread.join()
        if ours_error:
            self.stop()
            raise ours_error[0]

    def djl_url(self) -> str:
        if self.djl is None:
            assert self.djl_error is not None
            raise self.djl_error
        return self.djl.url

    def stop(self) -> None:
        self.ours.stop()
        if self.djl is not None:
            self.djl.stop()


class PairPool:
    """At most one pair alive (2 shared cores); cases are ordered by model, so each starts once."""

    def __init__(self, root: Path, model_id: Path) -> None:
        self.root = root
        self.model_id = model_id
        self.current: Optional[Pair] = None
        self.timings: dict[str, dict[str, Optional[float]]] = {}

    def get(self, model: str) -> Pair:
        if self.current is not None and self.current.model == model:
            return self.current
        self.close()
        model_dir = materialize(MODELS[model], self.model_id, self.root / "models")
        pair = Pair(model, model_dir, self.root)
        self.timings[model] = {
            "ours_startup_s": pair.ours.startup_seconds,
            "djl_startup_s": pair.djl.startup_seconds if pair.djl else None,
        }
        self.current = pair
        return pair

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


CAPTURED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[PairPool]:  # noqa: F811
    reason = djl_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    pairs = PairPool(tmp_path_factory.mktemp("compat"), tiny_dir.resolve())
    try:
        yield pairs
    finally:
        pairs.close()
        target = os.environ.get("COMPAT_CAPTURE")
        if target:
            Path(target).write_text(json.dumps({"timings": pairs.timings, "cases": CAPTURED}, indent=1) + "\n")


def _reply_json(reply: Reply) -> dict[str, Any]:
    return {"status": reply.status, "content_type": reply.content_type, "body": reply.as_text()}


def _params() -> list[Any]:
    params = []
    for case in CASES:
        marks: list[Any] = []
        if case.id in RESOLVER_PENDING:
            marks.append(pytest.mark.xfail(strict=False, reason=RESOLVER_PENDING[case.id]))
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


# =========================================================================== part 1: black box
def check_semantics(case: Case, replies: list[Reply]) -> None:
    """Facts about our server's replies that do not depend on the other server."""
    if case.model == "hf-tiny" and case.id.startswith("rb-") and case.id != "rb-unknown-model":
        # option.rolling_batch=auto with a local HF folder is dynamic batch on DJL 0.34, and so on
        # our server (config/resolve.py): answers are lists, refusals are 200 bodies with code 400
        for reply in replies:
            body = json.loads(reply.body)
            assert reply.status == 200 and reply.content_type == "application/json", reply
            if case.id in ("rb-bad-json", "rb-bad-parameter", "rb-unknown-parameter"):
                assert body["code"] == 400 and body["message"] == "invalid request", body
            else:
                assert isinstance(body, list) and all("generated_text" in x for x in body), body
        return
    for reply in replies:
        assert reply.status in case.expect_status, reply
        assert reply.content_type is not None
    first = replies[0]
    kind = case.id.replace("rbs-", "rb-", 1)
    if kind == "rb-json-full-text-stop":
        body = json.loads(first.body)
        assert body["generated_text"].startswith("Deep learning is ")
        # the stop string is removed (docs/parameters.md), on both servers
        assert not body["generated_text"].endswith(" Average") and " Average" not in body["generated_text"]
        assert body["details"]["finish_reason"] == "stop_sequence"
    elif kind.startswith("rb-jsonlines"):
        lines = [json.loads(line) for line in first.body.decode().splitlines()]
        assert first.content_type == "application/jsonlines"
        assert "generated_text" in lines[-1] and all("token" in line for line in lines)
    elif case.id in ("db-list-inputs", "db-concurrent"):
        bodies = [json.loads(r.body) for r in replies]
        assert sum(len(b) for b in bodies) == 2 and all("generated_text" in x for b in bodies for x in b)
    elif case.id.startswith("dbs-stream"):
        lines = [json.loads(line) for line in first.body.decode().splitlines()]
        assert first.content_type == "application/jsonlines" and len(lines) >= 3
        assert all(len(line["outputs"]) == len(lines[0]["outputs"]) for line in lines)
    elif case.id == "custom-prompt":
        lines = [json.loads(line) for line in first.body.decode().splitlines()]
        assert first.content_type == "application/x-compat-lines"
        assert lines[-1]["n_tokens"] == 3 and lines[-1]["finish"] == "length"
        assert "".join(line["piece"] for line in lines[:-1]) == lines[-1]["answer"]


def test_greedy_text_matches_generate(pool: PairPool, tiny_model: Any) -> None:  # noqa: F811
    """The text both servers agree on is the model's own greedy continuation (fp32)."""
    import torch

    model, tokenizer = tiny_model
    ids = tokenizer("Deep learning is", return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=6, do_sample=False)
    expected = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    pair = pool.get("hf-tiny-scheduler")
    case = next(c for c in CASES if c.id == "rbs-json")
    for url in (pair.ours.url, pair.djl_url()):
        reply = run_case(url, case, seed_workaround=negative_seed_rejected())[0]
        assert json.loads(reply.body) == {"generated_text": expected}


def test_rolling_request_without_seed_on_djl(pool: PairPool) -> None:
    """Requests that carry no seed (and text/plain ones, which cannot) must all succeed on DJL."""
    pair = pool.get("hf-tiny-scheduler")
    from compat_cases import Call, send

    statuses = [
        send(pair.djl_url(), Call(b"Deep learning is", content_type="text/plain")).status for _ in range(8)
    ]  # P(all 8 seeds >= 0) = 1/256
    assert statuses == [200] * 8


DJL_TIMEOUT = 60.0  # every case answers in a few seconds; a lost reply costs this much


def run_on_djl(pair: Pair, case: Case, workaround: bool) -> list[Reply]:
    """``case`` on DJL's front end. DJL's HTTP writer can miss a reply that is one last chunk and never
    write its header (its ``ChunkedBytesSupplier`` race, docs/djl-serving.md): a one-call case whose
    refusal the worker provably sent (it logs each one) is sent once more. A request the worker never
    answered fails the case, with DJL's log."""
    url = pair.djl_url()
    assert pair.djl is not None
    before = pair.djl.worker_answers()
    try:
        return run_case(url, case, seed_workaround=workaround, timeout=DJL_TIMEOUT)
    except httpx.TimeoutException:
        if len(case.calls) > 1 or pair.djl.worker_answers() <= before:
            raise AssertionError(f"DJL's front end left {case.id} unanswered and its worker's log shows no "
                                 f"answer:\n{pair.djl.log_tail(40)}") from None
    return run_case(url, case, seed_workaround=workaround, timeout=DJL_TIMEOUT)


@pytest.mark.parametrize("case", _params())
def test_same_reply(pool: PairPool, case: Case) -> None:
    pair = pool.get(case.model)
    workaround = MODELS[case.model].rolling and negative_seed_rejected()
    ours = run_case(pair.ours.url, case, seed_workaround=workaround)
    CAPTURED[case.id] = {"ours": [_reply_json(r) for r in ours], "seed_workaround": workaround}
    check_semantics(case, ours)
    theirs = run_on_djl(pair, case, workaround)
    CAPTURED[case.id]["djl"] = [_reply_json(r) for r in theirs]
    for mine, djl in zip(ours, theirs, strict=True):
        assert comparable(mine, case.compare) == comparable(djl, case.compare)


def test_differences_are_documented() -> None:
    """Every case that does not compare exactly names a difference docs/compatibility.md explains."""
    doc = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    for case in CASES:
        assert (case.compare == "exact") == (case.difference is None), case.id
    for key in {c.difference for c in CASES if c.difference} | set(DIFFERENCES):
        assert key in DIFFERENCES and f"`{key}`" in doc, key


# =========================================================================== part 2: handler level
@pytest.fixture(scope="module")
def djl_io() -> Iterator[tuple[type, type]]:
    """DJL's own ``(Input, Output)`` from the extracted jar, visible only while this module runs."""
    if not (DJL_PYTHON / "djl_python" / "inputs.py").is_file():
        pytest.skip(f"no djl_python in {DJL_PYTHON}: run tests/djl_serving/fetch.sh")
    saved_path = list(sys.path)
    saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] == "djl_python"}
    sys.path.insert(0, str(DJL_PYTHON))
    try:
        inputs: ModuleType = importlib.import_module("djl_python.inputs")
        outputs: ModuleType = importlib.import_module("djl_python.outputs")
        yield inputs.Input, outputs.Output
    finally:
        sys.path[:] = saved_path
        for name in [m for m in sys.modules if m.split(".")[0] == "djl_python"]:
            del sys.modules[name]
        sys.modules.update(saved)






Handler = Callable[[Any], Any]


def _service(init_frame: bytes, input_cls: type) -> Handler:
    """A fresh huggingface service, initialised by an empty Input of ``input_cls``."""
    from djl_handlers.service import InferenceService

    service = InferenceService("huggingface")
    assert service.handle(_read(input_cls, init_frame)) is None
    return service.handle


def _pair(djl_io: tuple[type, type], options: dict[str, str]) -> tuple[Handler, Handler]:
    """(service fed DJL's Inputs, service fed ours), both initialised by the same init frame."""
    frame = wire.encode_input_frame({**options, "handler": "handle"}, [])
    return _service(frame, djl_io[0]), _service(frame, Input)


def _both(djl_io: tuple[type, type], handlers: tuple[Handler, Handler], frame: bytes) -> tuple[Any, Any, bytes]:
    """Run one frame through both; check the classes and equal content; return the outputs and bytes."""
    theirs = handlers[0](_read(djl_io[0], frame))
    ours = handlers[1](_read(Input, frame))
    assert type(theirs) is djl_io[1]
    assert type(ours) is Output
    assert dict(theirs.properties) == dict(ours.get_properties())
    assert (theirs.code, theirs.message) == (ours.code, ours.message)
    sent = _sent(theirs)
    assert sent == _sent(ours)
    return theirs, ours, sent


def _options(model: Path, **extra: str) -> dict[str, str]:
    # a fixed KV bound: the default (half the memory free at load) differs between the two engines
    return {"model_id": str(model), "dtype": "fp32", "model_dir": str(model), "kv_cache_memory_bytes": "1G", **extra}


def _batch_frame(bodies: list[Optional[bytes]], seeds: Optional[list[str]] = None) -> bytes:
    props = {"batch_size": str(len(bodies))}
    content: list[tuple[Optional[str], bytes]] = []
    for i, body in enumerate(bodies):
        prefix = f"batch_{i:03d}."
        if body is None:  # a later rolling-batch step: empty data, no properties
            content.append((prefix + "data", b""))
            continue
        props[prefix + "Content-Type"] = "application/json"
        content.append((prefix + "data", body))
        if seeds is not None:
            content.append((prefix + "seed", seeds[i].encode()))
    return wire.encode_input_frame(props, content)


def test_rolling_handler_returns_djl_output(djl_io: tuple[type, type], tiny_dir: Path) -> None:  # noqa: F811
    handlers = _pair(djl_io, _options(tiny_dir, rolling_batch="auto"))
    bodies = [
        json.dumps({"inputs": "Deep learning is", "parameters": {"max_new_tokens": 3, "details": True}}),
        json.dumps({"inputs": "Hello", "stream": True, "parameters": {"max_new_tokens": 5}}),
    ]
    frame = _batch_frame([b.encode() for b in bodies], seeds=["1234", "77"])
    active, texts = [0, 1], {0: "", 1: ""}
    for _ in range(10):
        theirs, _, _ = _both(djl_io, handlers, frame)
        records = [wire.binary_decode(bytes(theirs.content.value_at(i))) for i in range(len(active))]
        assert theirs.properties.get("batch_0_Content-Type") in ("application/json", "application/jsonlines")
        for slot, record in zip(list(active), records, strict=True):
            assert "code" not in record, record
            texts[slot] += record.get("data", "")
        active = [slot for slot, record in zip(active, records, strict=True) if record.get("last") != "True"]
        if not active:
            break
        frame = _batch_frame([None] * len(active))
    assert not active
    assert json.loads(texts[0])["details"]["generated_tokens"] == 3
    assert len(texts[1].splitlines()) == 5


def test_dynamic_handler_returns_djl_output(djl_io: tuple[type, type], tiny_dir: Path) -> None:  # noqa: F811
    handlers = _pair(djl_io, _options(tiny_dir, rolling_batch="disable"))
    frame = _batch_frame(
        [
            json.dumps({"inputs": ["Deep learning is", "Hi"], "parameters": {"max_new_tokens": 3}}).encode(),
            b'{"inputs": "Deep',
        ]
    )
    theirs, _, _ = _both(djl_io, handlers, frame)
    assert theirs.properties["Content-Type"] == "application/json"
    first = json.loads(bytes(theirs.content.value_at(0)))
    assert [sorted(x) for x in first] == [["generated_text"], ["generated_text"]]
    assert json.loads(bytes(theirs.content.value_at(1)))["code"] == 400


def test_dynamic_stream_handler_returns_djl_output(djl_io: tuple[type, type], tiny_dir: Path) -> None:  # noqa: F811
    handlers = _pair(djl_io, _options(tiny_dir, rolling_batch="disable", enable_streaming="true"))
    frame = _batch_frame([json.dumps({"inputs": "Deep learning is", "parameters": {"max_new_tokens": 3}}).encode()])
    theirs, _, sent = _both(djl_io, handlers, frame)
    assert theirs.properties["Content-Type"] == "application/jsonlines"
    assert b'{"outputs": [' in sent


def test_rolling_handler_accepts_negative_java_seed(djl_io: tuple[type, type], tiny_dir: Path) -> None:  # noqa: F811
    handlers = _pair(djl_io, _options(tiny_dir, rolling_batch="auto"))
    body = json.dumps({"inputs": "Deep learning is", "parameters": {"max_new_tokens": 2}}).encode()
    theirs, _, _ = _both(djl_io, handlers, _batch_frame([body], seeds=["-1252582975"]))
    record = wire.binary_decode(bytes(theirs.content.value_at(0)))
    assert "code" not in record, record


def test_init_with_djl_injected_formatters(djl_io: tuple[type, type], tmp_path: Path, tiny_dir: Path) -> None:  # noqa: F811
    """DJL's worker puts model.py's decorated formatters into the init properties as functions."""
    from djl_handlers.service import InferenceService

    materialize(MODELS["hf-custom"], tiny_dir.resolve(), tmp_path)
    model_dir = tmp_path / "hf-custom"
    sys.path.insert(0, str(model_dir))
    sys.modules.pop("model", None)  # another test's model.py may already be imported under this name
    try:
        user = importlib.import_module("model")
    finally:
        sys.path.remove(str(model_dir))
        sys.modules.pop("model", None)
    init = _read(
        djl_io[0], wire.encode_input_frame(_options(tiny_dir, rolling_batch="auto", model_dir=str(model_dir)), [])
    )
    init.properties["output_formatter"] = user.pieces_then_answer  # what python_sync_engine does
    init.properties["input_formatter"] = user.prompt_and_count
    assert InferenceService("huggingface").handle(init) is None
