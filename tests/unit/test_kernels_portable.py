"""The C kernels build and compute correctly off this CPU: for an older x86-64 level and for arm64.

``tests/kernels_c/check_kernels.c`` checks RMSNorm, SiLU·mul and the row statistics against
double-precision references without Python. It runs here, built with the package's own flags, and
built for arm64 (AWS Graviton) with Debian's ``aarch64-linux-gnu-gcc`` and run under ``qemu-aarch64``
when those are installed (``.ci/run`` installs them); every kernel source, the attention and rotary
ones included, must also compile for arm64 with the flags a Graviton machine would use.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from djl_handlers.kernels import build, int8_gemm

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "djl_handlers" / "kernels"
DRIVER = ROOT / "tests" / "kernels_c" / "check_kernels.c"
CHECKED = ("rms_norm", "silu_mul", "row_stats", "int8_gemm")
EXTRA_FLAGS = {"int8_gemm": list(int8_gemm.FLAGS)}  # each kernel's own flags after the package's
CROSS = "aarch64-linux-gnu-gcc"
SYSROOT = Path("/usr/aarch64-linux-gnu")


def _build_driver(cc: str, kernel_flags: list[str], out: Path, libs: list[str]) -> Path:
    objects = []
    for name in CHECKED:
        obj = out.parent / f"{name}.o"
        flags = [*kernel_flags, *EXTRA_FLAGS.get(name, [])]
        subprocess.run([cc, *flags, "-c", "-o", str(obj), str(KERNELS / f"{name}.c")], check=True,
                       capture_output=True, text=True, timeout=300)
        objects.append(str(obj))
    driver = [cc, "-O2", "-ffp-contract=off", "-fopenmp", "-o", str(out), str(DRIVER)]  # IEEE references
    subprocess.run([*driver, *objects, *libs], check=True, capture_output=True, text=True, timeout=300)
    return out


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.skipif(build.compiler() is None, reason="no C compiler")
@pytest.mark.parametrize("march", ["native", "x86-64-v3", "x86-64-v2"])
def test_the_kernels_compute_their_references_at_each_x86_level(tmp_path: Path, march: str) -> None:
    if platform.machine() not in ("x86_64", "AMD64") and march != "native":
        pytest.skip("x86-64 levels")
    cc = build.compiler()
    assert cc is not None
    flags = [f if f != "-march=native" else f"-march={march}" for f in build.FLAG_SETS[0]]
    exe = _build_driver(cc, flags, tmp_path / "check", ["-lm"])
    assert _run([str(exe)]).splitlines()[-1] == "ok"


@pytest.mark.skipif(shutil.which(CROSS) is None, reason=f"no {CROSS} (Debian: gcc-aarch64-linux-gnu)")
@pytest.mark.parametrize("name", sorted(p.stem for p in KERNELS.glob("*.c")))
def test_every_kernel_compiles_for_arm64(tmp_path: Path, name: str) -> None:
    # a Graviton 2/3 target; on the machine itself the build uses -march=native, which gcc supports on arm64
    flags = [f if f != "-march=native" else "-march=armv8.2-a" for f in build.FLAG_SETS[0]]
    done = subprocess.run([CROSS, *flags, "-c", "-o", str(tmp_path / f"{name}.o"), str(KERNELS / f"{name}.c")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr


@pytest.mark.skipif(shutil.which(CROSS) is None or shutil.which("qemu-aarch64") is None
                    or not (SYSROOT / "lib").is_dir(),
                    reason="no aarch64 cross compiler, qemu-aarch64 or arm64 runtime libraries")
def test_the_kernels_compute_their_references_on_arm64(tmp_path: Path) -> None:
    flags = [f if f != "-march=native" else "-march=armv8.2-a" for f in build.FLAG_SETS[0]]
    exe = _build_driver(CROSS, flags, tmp_path / "check-arm64", ["-lm"])
    out = _run(["qemu-aarch64", "-L", str(SYSROOT), str(exe)])
    assert out.splitlines()[-1] == "ok", out
    assert "rms_norm fp32, lanes 1/4/8/16: ok" in out
