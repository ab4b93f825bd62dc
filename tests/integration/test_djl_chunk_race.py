"""DJL's streamed reply buffer can lose a one-chunk reply: the race the DJL-front-end tests allow for.

DJL's HTTP writer loops ``while (supplier.hasNext())`` over a ``ChunkedBytesSupplier`` and writes the
response header inside the loop; ``appendContent(bytes, last=true)`` marks the buffer complete before
it queues the bytes. A reply that is one last chunk (every non-streamed answer and every error in
rolling batch and async mode) arriving while the writer asks ``hasNext()`` ends the loop before any
header: the client waits until its own timeout. ``tests/djl_serving/ChunkRaceProbe.java`` races the
two calls with DJL's own ``api`` jar of each release; this test fails once a release no longer loses
replies, so the resend in the matrix and corpus tests (docs/djl-serving.md) can then go.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from djl_server_fixture import version_param

pytestmark = pytest.mark.djl

HERE = Path(__file__).resolve().parents[1] / "djl_serving"
LIBS = {"0.34": HERE / "lib", "0.36": HERE / "lib-0.36.0"}
ROUNDS = 200_000  # a few hundred to a few thousand lost on a 2-core machine; about 6 s


@pytest.mark.parametrize("release", [version_param(r) for r in LIBS])
def test_a_one_chunk_reply_can_be_missed_by_djls_writer(release: str) -> None:
    lib = LIBS[release]
    if shutil.which("java") is None or not list(lib.glob("api-*.jar")):
        pytest.skip(f"java or DJL {release}'s api jar missing (run tests/djl_serving/fetch.sh)")
    result = subprocess.run(["java", "-cp", f"{lib}/*", str(HERE / "ChunkRaceProbe.java"), str(ROUNDS)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    words = result.stdout.split()
    assert words[0] == "lost" and words[2] == "of", result.stdout
    assert int(words[1]) > 0, f"DJL {release}'s ChunkedBytesSupplier lost no reply in {ROUNDS} rounds: {result.stdout}"
