"""The model folder the GPU check runs on, chosen in one place for ``benchmarks.gpu_check`` and ``tests/gpu``.

``$DJL_HANDLERS_GPU_MODEL`` when set (``scripts/gpu_check.sh`` sets it), else the embedded model.
Where the embedded model is not available (a lent GPU machine: its weights are not carried), the
script builds the SmolLM2-135M-shaped random model (``smollm2-135m`` of
``djl_handlers.model.architectures``, seed 0) with the tokenizer files that ``--prepare`` carried:
the same shapes, so the same speed; fp32 equality with ``generate()`` is a property of the engine,
whatever the weights.

    python -m benchmarks.gpu_model --tokenizer DIR --build DIR [--shape NAME]  # prints: folder TAB what it is
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ENV = "DJL_HANDLERS_GPU_MODEL"
SHAPE = "smollm2-135m"
SEED = 0


def model_dir() -> Path:
    """``$DJL_HANDLERS_GPU_MODEL``, else the embedded model (ConfigError when neither is there)."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    from djl_handlers.model.embedded import embedded_model_dir

    return embedded_model_dir()


def describe(folder: Path) -> str:
    """What ``folder`` holds, for the results: ``random <shape> seed N``, ``embedded SmolLM2-135M-Instruct``,
    or ``folder <name>``."""
    from djl_handlers.model.architectures import MARKER as RANDOM_MARKER
    from djl_handlers.model.embedded import MARKER as EMBEDDED_MARKER

    try:
        settings = json.loads((folder / RANDOM_MARKER).read_text(encoding="utf-8"))
        return f"random {settings['shape']['name']} seed {settings['seed']} ({settings['dtype']} weights)"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if (folder / EMBEDDED_MARKER).is_file():
        return "embedded SmolLM2-135M-Instruct"
    return f"folder {folder.name}"


def resolve(tokenizer: Path | None, build: Path | None, shape: str | None = None,
            weights_dtype: str = "float32") -> Path:
    """The folder to run on. Without ``shape``: ``$DJL_HANDLERS_GPU_MODEL``, else the embedded model, else
    the random :data:`SHAPE` built at ``build`` from the carried ``tokenizer`` files. With ``shape``: that
    random shape, built at ``build`` (tokenizer: the carried files, else the embedded model's).
    Raises SystemExit with the reason when neither can be had."""
    from djl_handlers.errors import ConfigError

    carried = tokenizer if tokenizer is not None and (tokenizer / "tokenizer.json").is_file() else None
    if shape is None:
        try:
            return model_dir()
        except ConfigError as exc:
            if carried is None:
                raise SystemExit(f"gpu_check: the embedded model is not available ({exc.message}) and no carried "
                                 "tokenizer to build a random model from: run scripts/gpu_check.sh --prepare "
                                 "where the embedded model is") from exc
        shape = SHAPE
    if build is None:
        raise SystemExit(f"gpu_check: --build DIR is needed to build the random {shape}")
    from djl_handlers.model.architectures import build_model_dir

    try:
        return build_model_dir(build, shape, seed=SEED, dtype=weights_dtype, source=carried)
    except ConfigError as exc:
        raise SystemExit(f"gpu_check: no tokenizer for the random {shape}: {exc.message}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, help="folder of the carried tokenizer files")
    parser.add_argument("--build", type=Path, help="where to build a random model")
    parser.add_argument("--shape", help="build this random shape (djl_handlers.model.architectures) instead")
    parser.add_argument("--weights-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="stored dtype of a random model's weights")
    args = parser.parse_args(argv)
    folder = resolve(args.tokenizer, args.build, args.shape, args.weights_dtype)
    print(f"{folder}\t{describe(folder)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
