"""djl_handlers/openmp.py: the worker's OpenMP waiting, in the environment ``djl-handlers serve`` gives
its worker and in the process DJL's own front end starts (applied before torch loads libgomp)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from djl_handlers.openmp import (
    OPENMP_SPIN_COUNT,
    USER_KEYS,
    in_process_defaults,
    libgomp_loaded,
    libgomp_paths,
    release_thread_pool,
)

ROOT = Path(__file__).resolve().parents[2]


def _maps(tmp_path: Path, *libraries: str) -> Path:
    path = tmp_path / "maps"
    path.write_text("".join(f"7f00-7f01 r-xp 0 08:01 1 /usr/lib/{name}\n" for name in ("libc.so.6", *libraries)))
    return path


def test_before_libgomp_loads_the_default_is_set(tmp_path: Path) -> None:
    env: dict[str, str] = {"PATH": "/bin"}
    line = in_process_defaults(env, _maps(tmp_path))
    assert env == {"PATH": "/bin", "GOMP_SPINCOUNT": OPENMP_SPIN_COUNT}
    assert f"GOMP_SPINCOUNT={OPENMP_SPIN_COUNT}" in line


@pytest.mark.parametrize("chosen", [{"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"}])
def test_the_users_choice_wins(chosen: dict[str, str], tmp_path: Path) -> None:
    env = dict(chosen)
    line = in_process_defaults(env, _maps(tmp_path))
    assert env == chosen
    key, value = next(iter(chosen.items()))
    assert f"{key}={value} (the environment's)" in line


def test_after_libgomp_loaded_nothing_is_set_and_the_line_says_what_to_do(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    line = in_process_defaults(env, _maps(tmp_path, "python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1"))
    assert env == {}
    assert "libgomp's default" in line and f"GOMP_SPINCOUNT={OPENMP_SPIN_COUNT} in the server's environment" in line


def test_without_proc_torch_stands_for_libgomp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", object())
    assert libgomp_loaded(tmp_path / "missing")
    monkeypatch.delitem(sys.modules, "torch")
    assert not libgomp_loaded(tmp_path / "missing")


PROBE = """
import torch  # noqa: the import that loads libgomp
torch.ones(4096).sum()
"""


def _display(code: str) -> tuple[str, str]:
    """``code`` run in a fresh interpreter with libgomp printing its settings as it loads: (stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in USER_KEYS}
    env.update(OMP_DISPLAY_ENV="verbose", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def test_libgomp_reads_the_in_process_default_when_the_service_comes_first() -> None:
    pytest.importorskip("torch")
    out, err = _display("from djl_handlers.openmp import in_process_defaults, libgomp_loaded\n"
                        "print(libgomp_loaded()); print(in_process_defaults())" + PROBE + "print(libgomp_loaded())")
    if "OPENMP DISPLAY ENVIRONMENT" not in err:
        pytest.skip("this torch's OpenMP runtime is not GNU libgomp")
    first, line, after = out.splitlines()[:3]
    assert (first, after) == ("False", "True")
    assert f"GOMP_SPINCOUNT={OPENMP_SPIN_COUNT}" in line
    assert f"GOMP_SPINCOUNT = '{OPENMP_SPIN_COUNT}'" in err  # what libgomp itself runs with


def test_libgomp_keeps_its_default_when_torch_came_first() -> None:
    pytest.importorskip("torch")
    out, err = _display(PROBE + "from djl_handlers.openmp import in_process_defaults\nprint(in_process_defaults())")
    if "OPENMP DISPLAY ENVIRONMENT" not in err:
        pytest.skip("this torch's OpenMP runtime is not GNU libgomp")
    assert "libgomp's default" in out
    assert "GOMP_SPINCOUNT = '" in err and f"GOMP_SPINCOUNT = '{OPENMP_SPIN_COUNT}'" not in err


def test_libgomp_paths_lists_each_copy_once_in_mapping_order(tmp_path: Path) -> None:
    maps = _maps(tmp_path, "python3.11/site-packages/sentencepiece.libs/libgomp-6a29c32d.so.1.0.0",
                 "python3.11/site-packages/torch/lib/libgomp.so.1",
                 "python3.11/site-packages/torch/lib/libgomp.so.1", "libgompish.txt/other.so")
    assert libgomp_paths(maps) == ["/usr/lib/python3.11/site-packages/sentencepiece.libs/libgomp-6a29c32d.so.1.0.0",
                                   "/usr/lib/python3.11/site-packages/torch/lib/libgomp.so.1"]
    assert libgomp_paths(tmp_path / "missing") is None
    assert release_thread_pool(tmp_path / "missing") == 0
    assert release_thread_pool(_maps(tmp_path)) == 0  # no libgomp: nothing to release


POOL = """
import os, threading, time
import torch
from djl_handlers.openmp import release_thread_pool

def threads() -> int:
    return len(os.listdir("/proc/self/task"))

torch.set_num_threads(2)
x = torch.randn(512, 512)
expected = (x @ x).sum()  # a parallel region on this thread: its pool gets a partner thread
before = threads()
released = release_thread_pool()
for _ in range(100):  # the freed partner exits on its own
    if threads() < before:
        break
    time.sleep(0.05)
after = threads()
box = {}
worker = threading.Thread(target=lambda: box.setdefault("sum", (x @ x).sum()))
worker.start()
worker.join()
print(released, before, after, bool(torch.allclose(box["sum"], expected)))
"""


def test_releasing_the_loading_threads_pool_ends_its_partner_threads() -> None:
    """After a parallel region on this thread, its idle OpenMP partner stays alive (libgomp counts it);
    released, the partner exits, and another thread's parallel regions still compute the same."""
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", POOL], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    released, before, after, same = done.stdout.split()
    if released == "0":
        pytest.skip("this torch's OpenMP runtime is not a libgomp with omp_pause_resource_all")
    assert int(after) == int(before) - 1, done.stdout
    assert same == "True"
