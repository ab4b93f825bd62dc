"""A configuration matrix run on DJL Serving's real ModelServer (0.34 and 0.36) and on ``djl-handlers serve``.

Rows: the configurations of ``matrix_cases.CONFIGS`` (no rolling_batch, auto, auto without
option.model_id, scheduler with batch_size 1 and 2 (+max_batch_delay), disable with batch_size 2,
enable_streaming, output_formatter=jsonlines, tgi_compat, OPTION_* variables only,
option.async_mode=true, SERVING_FEATURES=vllm without a rolling_batch, vllm and lmi-dist) for the
tiny model (fp32, greedy), each on every DJL release it applies to (test ids ``djl-0.34`` /
``djl-0.36``). Columns: the request kinds of ``matrix_cases.KINDS`` (json, stream, details, ["a"],
["a","b"], bad JSON, max_new_tokens=-1, an unknown parameter).

Both servers are started once per (release, configuration) (in parallel) and reused across the
request kinds; at most one pair is alive. Our server gets ``DJL_HANDLERS_DJL_RULES=<release>``, so
its resolver applies that release's rules. Per cell: same status, same media type, same parsed body
(JSON, JSON lines or SSE events; TGI's randomly drawn ``details.seed`` left out), and the reply is
an LMI answer or a clear error. What DJL's front end decided (the properties it logs after its
LmiConfigRecommender) must equal what our resolver decided with the same release's rules.
``MATRIX_CAPTURE=/path/file.json`` writes every reply pair. Where a configuration needs vLLM, which
is not installed here (vllm, lmi-dist; the vllm feature on 0.34), both servers must refuse to start
and say why.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from djl_server_fixture import DjlServer, DjlServerError, djl_skip_reason, version_param
from matrix_cases import (
    KINDS,
    RELEASES,
    Kind,
    MatrixConfig,
    cases,
    djl_mode,
    djl_rolling_batch,
    lmi_shape_problem,
    media_type,
    parse_body,
    without_random_seed,
    write_model_dir,
)
from test_server_harness import ServerProcess, wait_until

pytestmark = [pytest.mark.djl]

Reply = tuple[int, str, Any]  # status, media type, parsed body
DECIDED_KEYS = ("option.rolling_batch", "option.async_mode", "option.max_rolling_batch_size")


class MatrixPair:
    """Both servers for one (release, configuration), or why each could not start."""

    def __init__(self, release: str, config: MatrixConfig, model_dir: Path, env: dict[str, str],
                 logs: Path) -> None:
        self.release = release
        self.config = config
        self.model_dir = model_dir
        self.env = env
        self.ours: Optional[ServerProcess] = None
        self.djl: Optional[DjlServer] = None
        self.errors: dict[str, str] = {}

        def start_ours() -> None:
            try:
                self.ours = ServerProcess(model_dir, logs / f"ours-{release}-{config.id}.log", grace=5.0, env=env)
            except AssertionError as exc:  # the harness's "server did not start; log: ..."
                self.errors["ours"] = str(exc)

        thread = threading.Thread(target=start_ours)
        thread.start()
        try:
            self.djl = DjlServer(model_dir, env=env, startup_timeout=180, version=release).start()
        except DjlServerError as exc:
            self.errors["djl"] = str(exc)
        thread.join()

    def urls(self) -> tuple[str, str]:
        if self.errors or self.ours is None or self.djl is None:
            pytest.fail(f"{self.release}/{self.config.id}: a server did not start: {self.errors}")
        return self.ours.url, self.djl.url

    def stop(self) -> None:
        if self.ours is not None:
            self.ours.stop()
        if self.djl is not None:
            self.djl.stop()


class PairCache:
    """The one live pair, for the (release, configuration) the current test asks for; what each
    DJL server decided is kept after it stops."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root = root
        self.model = model
        self.current: Optional[MatrixPair] = None
        self.decided: dict[tuple[str, str], dict[str, str]] = {}

    def get(self, release: str, config: MatrixConfig) -> MatrixPair:
        current = self.current
        if current is not None and (current.release, current.config.id) == (release, config.id):
            return current
        self.close()
        reason = djl_skip_reason(release)
        if reason is not None:
            pytest.skip(reason)
        model_dir, env = write_model_dir(config, self.model, self.root / "models", release)
        self.current = MatrixPair(release, config, model_dir, env, self.root)
        if self.current.djl is not None:
            self.decided[(release, config.id)] = self.current.djl.model_settings()
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[PairCache]:  # noqa: F811
    reason = djl_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    cache = PairCache(tmp_path_factory.mktemp("matrix"), tiny_dir.resolve())
    try:
        yield cache
    finally:
        cache.close()
        target = os.environ.get("MATRIX_CAPTURE")
        if target:
            Path(target).write_text(json.dumps(CAPTURED, indent=1) + "\n", encoding="utf-8")


CAPTURED: dict[str, Any] = {}


def send(url: str, kind: Kind, timeout: float = 120.0) -> Reply:
    resp = httpx.post(url + "/invocations", content=kind.body, headers={"Content-Type": "application/json"},
                      timeout=timeout)
    content_type = resp.headers.get("content-type")
    return resp.status_code, media_type(content_type), without_random_seed(parse_body(content_type, resp.content))


DJL_TIMEOUT = 60.0  # every matrix request answers in well under a second; a lost reply costs this much


def send_to_djl(pair: MatrixPair, kind: Kind) -> Reply:
    """``kind`` to DJL's front end. DJL's HTTP writer can miss a reply that is one last chunk and
    never write its header (its ``ChunkedBytesSupplier`` race, docs/djl-serving.md): where the worker
    provably answered in time (DJL's async mode logs each finished request), the request is sent once
    more. A request the worker never finished fails the cell."""
    assert pair.djl is not None
    before = pair.djl.async_replies()
    try:
        return send(pair.djl.url, kind, timeout=DJL_TIMEOUT)
    except httpx.TimeoutException:
        if pair.djl.async_replies() <= before:
            raise AssertionError(f"DJL's worker did not finish the request:\n{pair.djl.log_tail(30)}") from None
    return send(pair.djl.url, kind, timeout=DJL_TIMEOUT)


def _params(*, loads: bool) -> list[Any]:
    """One case per (release, configuration), marked with the release's skip."""
    return [version_param(release, config, id=f"djl-{release}-{config.id}") for release, config in cases(loads=loads)]


def _cells() -> list[Any]:
    return [  # release- then configuration-major: one pair of servers per row
        version_param(release, config, kind, id=f"djl-{release}-{config.id}-{kind.id}")
        for release, config in cases(loads=True) for kind in KINDS
    ]


@pytest.mark.parametrize(("release", "config"), [
    pytest.param(release, config, id=f"djl-{release}-{config.id}") for release, config in cases(loads=True)
])  # no server: not skipped without the jars
def test_our_resolver_picks_djls_mode(tmp_path: Path, tiny_dir: Path, release: str,  # noqa: F811
                                      config: MatrixConfig) -> None:
    """No server needed: told the release, the one resolver gives every configuration the mode that
    release of DJL runs."""
    from djl_handlers.config.resolve import resolve_model

    model_dir, env = write_model_dir(config, tiny_dir.resolve(), tmp_path, release)
    resolved = resolve_model(model_dir, env)
    assert resolved.rules == release
    assert resolved.mode == djl_mode(config, release), resolved.why()
    value, is_async = djl_rolling_batch(config, release)
    assert (resolved.rolling_batch, resolved.async_mode) == (value, is_async)


@pytest.mark.parametrize(("release", "config", "kind"), _cells())
def test_cell(pairs: PairCache, release: str, config: MatrixConfig, kind: Kind) -> None:
    pair = pairs.get(release, config)
    ours_url, _ = pair.urls()
    ours, djl = send(ours_url, kind), send_to_djl(pair, kind)
    CAPTURED[f"{release}-{config.id}-{kind.id}"] = {"ours": ours, "djl": djl}
    for side, (status, ctype, body) in (("ours", ours), ("djl", djl)):
        problem = lmi_shape_problem(status, ctype, body)
        assert problem is None, f"{side}: {problem}"
    assert ours == djl


@pytest.mark.parametrize(("release", "config"), _params(loads=True))
def test_djl_front_end_decides_as_our_resolver(pairs: PairCache, release: str, config: MatrixConfig) -> None:
    """The properties DJL's front end logged after its rewrites equal what our resolver decided with
    that release's rules (rolling_batch, async_mode, max_rolling_batch_size)."""
    from djl_handlers.config.resolve import resolve_model

    decided = pairs.decided.get((release, config.id))
    if decided is None:  # this test runs alone: start the pair
        pair = pairs.get(release, config)
        assert pair.djl is not None, pair.errors
        decided = pairs.decided[(release, config.id)]
    assert decided, f"DJL {release} logged no model settings"
    model_dir, env = write_model_dir(config, pairs.model, pairs.root / "resolve", release)
    resolved = resolve_model(model_dir, env)
    ours = {f"option.{key[7:]}": resolved.options.get(key[7:]) for key in DECIDED_KEYS}
    djl = {key: decided.get(key) for key in DECIDED_KEYS}
    assert djl == ours, f"DJL {release} decided {djl}; our resolver ({resolved.rules}): {resolved.why()}"


def test_both_fronts_workers_settle_their_heap(pairs: PairCache) -> None:
    """Our worker settles after its init call; inside DJL's own worker (djl_python_engine.py) our
    handler settles after loading the model (djl_handlers/heap.py): both say so in their logs."""
    def ours_on_djl(config: MatrixConfig) -> bool:  # DJL runs our handler, not its own default one
        return config.option("entryPoint") == "djl_handlers.huggingface"

    live = pairs.current
    reuse = live is not None and ours_on_djl(live.config) and not live.errors  # no second start-up for this test
    if reuse and live is not None:
        pair = live
    else:
        release, config = next((r, c) for r, c in cases(loads=True) if ours_on_djl(c))
        pair = pairs.get(release, config)
    ours_url, djl_url = pair.urls()
    assert pair.ours is not None and pair.djl is not None and pair.djl.log_path is not None
    send(djl_url, KINDS[0])  # the model is loaded at start-up; one request proves it serves
    wait_until(lambda: "worker: heap settled" in pair.ours.log_path.read_text(), "our worker's settle line")
    djl_log = pair.djl.log_path.read_text(encoding="utf-8", errors="replace")
    assert "DJL worker: heap settled" in djl_log, pair.djl.log_tail()
    assert "front end: heap settled" in pair.ours.log_path.read_text()


@pytest.mark.parametrize(("release", "config"), _params(loads=False))
def test_needs_vllm_fails_clearly_on_both(pairs: PairCache, release: str, config: MatrixConfig) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: this configuration would load")
    assert djl_mode(config, release) == "fails"
    pair = pairs.get(release, config)
    djl_error = pair.errors.get("djl", "")
    if "vllm" not in djl_error.lower() and "Python worker errors:\n(none)" in djl_error:
        # DJL's Java side can exit before its reader thread has logged the worker's stderr (seen on
        # a loaded machine): the reason is then missing from its log, not from the worker. Once more.
        pairs.close()
        pair = pairs.get(release, config)
    assert set(pair.errors) == {"ours", "djl"}, f"expected both servers to refuse {config.id}: {pair.errors}"
    for side, message in pair.errors.items():
        assert "vllm" in message.lower(), f"{side} does not name vLLM:\n{message[-3000:]}"


@pytest.mark.parametrize("release", [version_param(r) for r in RELEASES])
def test_weights_in_the_model_directory_are_served(release: str) -> None:
    """``auto-no-model-id`` holds the same tiny weights as ``auto``: DJL must answer the same text."""
    with_id, without_id = CAPTURED.get(f"{release}-auto-json"), CAPTURED.get(f"{release}-auto-no-model-id-json")
    if with_id is None or without_id is None:
        pytest.skip("the auto and auto-no-model-id json cells did not run in this session")
    assert without_id["djl"] == with_id["djl"]
