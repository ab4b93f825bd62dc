"""Our NDList codec against DJL's own Java one (``ai.djl:api``'s ``NDList.encode/decode``).

``tests/djl_serving/NdlistProbe.java`` (run by Java's single-file launcher with the jars
``tests/djl_serving/fetch.sh`` puts in ``lib/``) decodes what we write, prints what DJL sees, and
writes DJL's own encodings (NDList, NPZ, safetensors) for us to read. Skipped without java or jars.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from djl_handlers.io.ndlist import from_nd_list, to_nd_list

np = pytest.importorskip("numpy")
pytestmark = pytest.mark.djl

HERE = Path(__file__).resolve().parents[1] / "djl_serving"
LIB = HERE / "lib"


def _utf(text: str) -> bytes:
    return struct.pack(">H", len(text)) + text.encode()


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, list[str]]:
    """Runs the probe once on our encoding of ``ARRAYS``: (folder with DJL's files, our bytes, stdout lines)."""
    if shutil.which("java") is None or not list(LIB.glob("api-*.jar")):
        pytest.skip("java or DJL's api jar missing (run tests/djl_serving/fetch.sh)")
    folder = tmp_path_factory.mktemp("ndlist-java")
    ours = bytes(to_nd_list(ARRAYS))
    (folder / "in.bin").write_bytes(ours)
    outputs = [str(folder / name) for name in ("re.bin", "java.bin", "java.npz", "java.st")]
    result = subprocess.run(
        ["java", "-cp", f"{LIB}/*", str(HERE / "NdlistProbe.java"), str(folder / "in.bin"), *outputs],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, ours, result.stdout.splitlines()


ARRAYS = [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.array([True, False]),
    np.arange(3, dtype=np.uint16),
    np.float64(2.5),
    np.zeros((0, 2), dtype=np.int8),
    np.array([-1, 2], dtype=">i8"),
    np.array([1.5, -2.0], dtype=np.float16),
]


def test_djl_decodes_our_bytes(probe: tuple[Path, bytes, list[str]]) -> None:
    _, _, lines = probe
    assert lines == [
        "float32 (2, 3) LITTLE_ENDIAN 000000000000803f0000004000004040000080400000a040",
        "boolean (2) LITTLE_ENDIAN 0100",
        "uint16 (3) LITTLE_ENDIAN 000001000200",
        "float64 () LITTLE_ENDIAN 0000000000000440",
        "int8 (0, 2) LITTLE_ENDIAN ",
        "int64 (2) LITTLE_ENDIAN ffffffffffffffff0200000000000000",
        "float16 (2) LITTLE_ENDIAN 003e00c0",
    ]


def test_djl_reencodes_our_bytes_identically(probe: tuple[Path, bytes, list[str]]) -> None:
    """Byte for byte, except the ignored sparse-format name (djl_python writes "default", Java "DENSE")."""
    folder, ours, _ = probe
    assert (folder / "re.bin").read_bytes() == ours.replace(_utf("default"), _utf("DENSE"))


def test_we_decode_djl_encodings(probe: tuple[Path, bytes, list[str]]) -> None:
    folder, _, _ = probe
    named_big_endian, scalar, flags = from_nd_list((folder / "java.bin").read_bytes())
    assert named_big_endian.dtype == np.int32 and named_big_endian.tolist() == [7, -8]
    assert scalar.dtype == np.float64 and scalar.shape == () and float(scalar) == 1.5
    assert flags.dtype == np.bool_ and flags.tolist() == [True, False, True]
    for name in ("java.npz", "java.st"):
        got = from_nd_list((folder / name).read_bytes())
        assert [(a.dtype.name, a.shape, a.tolist()) for a in got] == [
            ("float64", (), 1.5),
            ("bool", (3,), [True, False, True]),
        ], name
