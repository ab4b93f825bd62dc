"""Build a C kernel of this package into a shared library at first use, and load it with ctypes.

The source ships inside the package (``djl_handlers/kernels/<name>.c``, package data of the wheel
and the sdist). The library is compiled once per source, compiler and CPU into a cache folder
outside the package, so a read-only site-packages works (:func:`cache_dir`:
``DJL_HANDLERS_KERNEL_DIR``, else ``$DJL_HANDLERS_CACHE/kernels``, else
``$XDG_CACHE_HOME/djl_handlers/kernels``, else ``~/.cache/djl_handlers/kernels``) and loaded from
there afterwards: the file name carries a hash of the source, the flags, the compiler's version and
the CPU's feature flags, so a cache shared between different machines never loads a library built
for another CPU (``-march=native``; ``DJL_HANDLERS_KERNEL_MARCH`` names another target, e.g.
``x86-64-v3`` to build the AVX2 code on an AVX-512 machine, as the lower-ISA tests do). Concurrent
first builds (several workers) are safe: each
compiles to a private temporary file and renames it into place. ``python -m
djl_handlers.kernels.prebuild`` compiles every kernel ahead of the first request (an image build).

Why C + ctypes rather than a torch C++ extension: a plain C file compiles in about a second with
no torch headers and no pybind (a torch extension takes minutes on a 2-core box), and its OpenMP
runtime is the ``libgomp.so.1`` torch has already loaded. Failure (no compiler, a sandbox without
a writable cache) is reported, never raised: callers fall back to torch.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

LOG = logging.getLogger(__name__)

HERE = Path(__file__).parent
# Compile flags, tried in order; the first that compiles and loads wins. The first is the fast one:
# native instructions and vectorised expf (glibc's libmvec); the second is plain portable C.
FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC"),
    ("-O2", "-fopenmp", "-fPIC"),
)
LIBS: tuple[tuple[str, ...], ...] = (("-lmvec", "-lm"), ("-lm",))
# The link step is separate and never sees -ffast-math: linked with it, gcc (before 13) and clang add
# crtfastmath.o, whose constructor turns on flush-to-zero / denormals-are-zero for the whole process
# when the library loads, silently changing every later float computation of torch and numpy.
LINK_FLAGS: tuple[str, ...] = ("-shared", "-fopenmp")

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_errors: dict[str, str] = {}


def flag_sets() -> tuple[tuple[str, ...], ...]:
    """:data:`FLAG_SETS` with ``-march=native`` replaced by ``-march=$DJL_HANDLERS_KERNEL_MARCH`` when
    that is set (a lower ISA level than this CPU's, to build and test that code path here)."""
    march = os.environ.get("DJL_HANDLERS_KERNEL_MARCH", "").strip()
    if not march:
        return FLAG_SETS
    return tuple(tuple(f"-march={march}" if f == "-march=native" else f for f in flags) for flags in FLAG_SETS)


def cache_dir() -> Path:
    """Where built libraries are kept: ``$DJL_HANDLERS_KERNEL_DIR``, else ``kernels`` in the
    package's cache root (``$DJL_HANDLERS_CACHE``, as the embedded model uses), else in the user's
    cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``djl_handlers/kernels``)."""
    explicit = os.environ.get("DJL_HANDLERS_KERNEL_DIR")
    if explicit:
        return Path(explicit).expanduser()
    root = os.environ.get("DJL_HANDLERS_CACHE")
    if root:
        return Path(root).expanduser() / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "djl_handlers" / "kernels"


def source(name: str) -> Path:
    """The C file of kernel ``name`` in this (installed or checked-out) copy of the package."""
    return HERE / f"{name}.c"


def loaded() -> dict[str, Path | None]:
    """Each kernel this process has tried to load, with the library file it loaded (None when it
    could not be built; :func:`error` says why)."""
    with _lock:
        return {name: None if lib is None else Path(lib._name) for name, lib in _loaded.items()}


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc``/``gcc``/``clang`` on the PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def load(name: str, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built from ``<name>.c`` (built now if needed), or None when it cannot be built;
    :func:`error` then says why. ``extra_flags`` go after each of :data:`FLAG_SETS` (a kernel that
    needs IEEE arithmetic passes ``-fno-fast-math``, say); a kernel always passes the same ones.
    Thread-safe; the result is remembered for the process."""
    with _lock:
        if name not in _loaded:
            try:
                _loaded[name] = _build_and_load(name, extra_flags)
            except _BuildError as exc:
                _loaded[name] = None
                _errors[name] = str(exc)
                LOG.warning("kernel %s is unavailable: %s", name, exc)
        return _loaded[name]


def error(name: str) -> str | None:
    """Why :func:`load` returned None for ``name`` (None when it loaded or was never tried)."""
    return _errors.get(name)


class Function:
    """One C function of a kernel library: the library built and loaded at first use, the
    function's ctypes signature set once. ``fn`` holds it after the first successful :meth:`get`
    (hot paths read the attribute and call :meth:`get` only while it is None)."""

    def __init__(self, name: str, symbol: str, argtypes: list[Any], flags: tuple[str, ...] = (),
                 restype: Any = ctypes.c_int) -> None:
        self.name, self.symbol, self.argtypes, self.flags, self.restype = name, symbol, argtypes, flags, restype
        self.fn: Any = None

    def get(self) -> Any:
        """The loaded function (building the library if needed), or None when unavailable."""
        if self.fn is None:
            lib = load(self.name, self.flags)
            if lib is None:
                return None
            fn = getattr(lib, self.symbol)
            fn.argtypes = self.argtypes
            fn.restype = self.restype
            self.fn = fn
        return self.fn

    def available(self) -> bool:
        """True when the kernel builds and loads here (see :meth:`unavailable_reason` otherwise)."""
        return self.get() is not None

    def unavailable_reason(self) -> str | None:
        """Why the kernel cannot be used (None when it can)."""
        return None if self.available() else error(self.name) or "not built"


class _BuildError(RuntimeError):
    pass


def _build_and_load(name: str, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    c_file = source(name)
    if not c_file.is_file():
        raise _BuildError(f"{c_file} is missing from the installed package")
    cc = compiler()
    if cc is None:
        raise _BuildError("no C compiler found (set CC, or install gcc)")
    text = c_file.read_bytes()
    version = _version(cc)
    problems = []
    for base_flags, libs in zip(flag_sets(), LIBS, strict=True):
        flags = base_flags + tuple(extra_flags)
        digest = hashlib.sha256(
            b"\0".join([text, " ".join(flags + LINK_FLAGS + libs).encode(), version.encode(),
                        _cpu_flags().encode()])
        ).hexdigest()[:16]
        target = cache_dir() / f"{name}-{digest}.so"
        if not target.exists():
            problem = _compile(cc, c_file, target, flags, libs)
            if problem:
                problems.append(problem)
                continue
        try:
            return ctypes.CDLL(str(target))
        except OSError as exc:
            problems.append(f"{' '.join(flags)}: cannot load {target}: {exc}")
    raise _BuildError("; ".join(problems))


def _compile(cc: str, c_file: Path, target: Path, flags: tuple[str, ...], libs: tuple[str, ...]) -> str | None:
    """Compile, then link (separately: see :data:`LINK_FLAGS`), into ``target`` atomically; returns
    a problem description or None."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        return f"cannot write to {target.parent}: {exc} (set DJL_HANDLERS_KERNEL_DIR to a writable folder)"
    obj = tmp + ".o"  # unique as tmp is
    try:
        for cmd in ([cc, *flags, "-c", "-o", obj, str(c_file)], [cc, *LINK_FLAGS, "-o", tmp, obj, *libs]):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                return f"{' '.join(cmd)} failed: {done.stderr.strip()[-400:]}"
        os.replace(tmp, target)
        LOG.info("built kernel %s (%s)", target.name, " ".join(flags))
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{cc} failed: {exc}"
    finally:
        for path in (tmp, obj):
            if os.path.exists(path):
                os.unlink(path)
