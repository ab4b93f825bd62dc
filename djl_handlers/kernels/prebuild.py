"""``python -m djl_handlers.kernels.prebuild``: compile every kernel now rather than at first use.

An image build (``docker/Dockerfile``) runs it once so that no container compiles at its first
request; it builds into the same cache folder the engine reads (:func:`~djl_handlers.kernels.build.cache_dir`),
so run it with the environment the server will have (``DJL_HANDLERS_CACHE`` or
``DJL_HANDLERS_KERNEL_DIR``). Prints one JSON line per kernel (``kernel``, ``library`` or ``error``)
and exits 1 when any kernel cannot be built (``--allow-unavailable``: 0 all the same).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from djl_handlers.kernels import KERNELS, build


def prebuild(names: Sequence[str] = KERNELS) -> list[dict[str, Any]]:
    """Build and load each kernel of ``names`` through its own module (so with its own flags);
    one record per kernel: its name, source, and the library it loaded or why it could not."""
    records = []
    for name in names:
        module = importlib.import_module(f"{__package__}.{name}")
        reason = module.unavailable_reason()
        library = build.loaded().get(name)
        record: dict[str, Any] = {"kernel": name, "source": str(build.source(name))}
        if reason is None and library is not None:
            record["library"] = str(library)
        else:
            record["error"] = reason or "not loaded"
        records.append(record)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build every kernel into the cache, print what happened."""
    parser = argparse.ArgumentParser(prog="python -m djl_handlers.kernels.prebuild", description=__doc__.split("\n")[0])
    parser.add_argument("--allow-unavailable", action="store_true",
                        help="exit 0 even when a kernel cannot be built (the engine then uses torch for it)")
    args = parser.parse_args(argv)
    print(json.dumps({"cache_dir": str(build.cache_dir())}), flush=True)
    records = prebuild()
    for record in records:
        print(json.dumps(record), flush=True)
    failed = [r["kernel"] for r in records if "error" in r]
    if failed:
        print(f"prebuild: cannot build {', '.join(failed)}", file=sys.stderr)
    return 1 if failed and not args.allow_unavailable else 0


if __name__ == "__main__":
    sys.exit(main())
