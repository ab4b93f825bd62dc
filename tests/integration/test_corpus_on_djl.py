"""The robustness corpus and the schema fuzzer's inputs through DJL Serving's real front end and ours.

One pair of servers per (DJL release, mode) on the fake-engine model directory
``tests/robustness/models/fake_lmi`` (the real djl_handlers pipeline, no ML library): DJL's
``ModelServer`` with its own Python worker (``tests/djl_serving/djl_server.py``, offline) and
``djl-handlers serve`` told the same release's rules. Every probe of
``tests/robustness/front_end_diff.py`` (each HTTP-able corpus case on ``/invocations`` and on
``/predictions/fake_lmi``, each input of ``tests/robustness/fuzz_inputs.json``) goes to both; the
statuses must be equal, where both answer an error the error body's media type and shape (its
keys, in order) too, and where both answer an LMI body the generated text, unless a row of the
table in ``docs/deviations.md`` documents the difference. A row that no longer matches anything
fails as well. The OpenAI and TGI routes exist
only on our server: the corpus's cases of those dialects reach DJL's ``/invocations`` with the
``X-Djl-Handlers-Api`` header our routes set.

``CORPUS_DJL_CAPTURE=/path/dir`` writes every pair's replies and differences as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
from djl_server_fixture import DjlServer, djl_skip_reason, version_param
from test_server_harness import ServerProcess

from tests.robustness.front_end_diff import (
    ALL,
    MODES,
    Reply,
    all_probes,
    describe,
    differences,
    read_table,
    send_all,
    stale,
    undocumented,
)

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "robustness" / "models" / "fake_lmi"
MODEL = "fake_lmi"
# the properties each mode sets on top of the fake model's (rolling_batch=auto: a rolling batch on
# both front ends, as the model has no config.json for DJL to read)
MODE_PROPERTIES = {
    "rolling": {"option.fake_step_delay": "0"},
    "dynamic": {"option.fake_step_delay": "0", "option.rolling_batch": "disable"},
    "async": {"option.fake_step_delay": "0", "option.rolling_batch": "disable", "option.async_mode": "true"},
}
PAIRS = [
    version_param("0.34", "rolling", id="djl-0.34-rolling"),
    version_param("0.34", "dynamic", id="djl-0.34-dynamic"),
    version_param("0.34", "async", id="djl-0.34-async"),
    version_param("0.36", "rolling", id="djl-0.36-rolling"),
    version_param("0.36", "dynamic", id="djl-0.36-dynamic"),
    version_param("0.36", "async", id="djl-0.36-async"),
]
START_TIMEOUT = 240.0
REQUEST_TIMEOUT = 30.0


def model_dir(root: Path, mode: str) -> Path:
    """A copy of the fake model named ``fake_lmi`` with ``mode``'s properties."""
    target = root / mode / MODEL
    shutil.copytree(FAKE, target, ignore=shutil.ignore_patterns("__pycache__"))
    props = target / "serving.properties"
    pending = dict(MODE_PROPERTIES[mode])
    lines = []
    for line in props.read_text(encoding="utf-8").splitlines():
        key = line.partition("=")[0].strip()
        lines.append(f"{key}={pending.pop(key)}" if key in pending and not line.startswith("#") else line)
    lines += [f"{key}={value}" for key, value in pending.items()]
    props.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def _in_parallel(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls on threads; their results in order, or the first exception raised."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _capture(release: str, mode: str, payload: dict[str, Any]) -> None:
    target = os.environ.get("CORPUS_DJL_CAPTURE")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / f"djl-{release}-{mode}.json").write_text(json.dumps(payload, indent=1) + "\n")


def _replies_json(replies: dict[str, Reply]) -> dict[str, Any]:
    return {name: [r.status, r.media, r.shape, r.text] for name, r in replies.items()}


def test_the_table_names_real_probes_modes_and_releases() -> None:
    """Every row of the table matches some probe and names known modes and releases (no DJL needed)."""
    rows = read_table()
    assert rows, "docs/deviations.md has no corpus table"
    names = {p.name for mode in MODES for p in all_probes(mode)}
    for row in rows:
        for pattern in row.cases:
            assert any(fnmatchcase(n, pattern) for n in names), (row, pattern)
        assert set(row.modes) <= {*MODES, ALL}, row
        assert set(row.releases) <= {"0.34", "0.36", ALL}, row
        assert row.what in ("status", "error body", "text"), row


@pytest.mark.slow
@pytest.mark.djl
@pytest.mark.parametrize(("release", "mode"), PAIRS)
def test_corpus_answers_as_djl_front_end(release: str, mode: str, tmp_path: Path) -> None:
    """Same status (and error body shape) on DJL's front end and ours, or a documented row."""
    reason = djl_skip_reason(release)
    if reason is not None:
        pytest.skip(reason)
    model = model_dir(tmp_path, mode)
    probes = all_probes(mode)
    djl = DjlServer(model, version=release, startup_timeout=START_TIMEOUT)
    ours: list[ServerProcess] = []
    resent: list[str] = []  # DJL 0.36 now and then leaves a request unanswered (docs/deviations.md)

    def start_ours() -> ServerProcess:
        server = ServerProcess(model, tmp_path / "ours.log", env={"DJL_HANDLERS_DJL_RULES": release},
                               start_timeout=START_TIMEOUT)
        ours.append(server)
        return server

    try:
        _in_parallel(djl.start, start_ours)
        theirs, mine = _in_parallel(lambda: send_all(djl.url, MODEL, probes, REQUEST_TIMEOUT, resent),
                                    lambda: send_all(ours[0].url, MODEL, probes, REQUEST_TIMEOUT))
    finally:
        for server in ours:
            server.stop()
        if djl.log_path is not None and djl.log_path.is_file():  # kept beside ours.log for a failure's reader
            shutil.copyfile(djl.log_path, tmp_path / "djl.log")
        djl.stop()
    found = differences(theirs, mine)
    rows = read_table()
    _capture(release, mode, {"counts": describe(probes, theirs, mine), "resent_to_djl": resent,
                             "differences": [str(d) for d in found],
                             "djl": _replies_json(theirs), "ours": _replies_json(mine)})
    assert sum(r.status == 200 for r in mine.values()) > 20, describe(probes, theirs, mine)  # not only refusals
    assert len(resent) <= 2, f"DJL left {len(resent)} requests unanswered: {resent}"
    new = undocumented(found, rows, release, mode)
    assert not new, "differences not in docs/deviations.md:\n" + "\n".join(new)
    old = stale(found, rows, release, mode)
    assert not old, "rows of docs/deviations.md that no longer differ:\n" + "\n".join(map(str, old))
