"""Start-up hook that lets vLLM's LLaVA module import where torchvision is absent (``.venv-vllm`` has none).

vLLM's ``llava.py`` imports its ``pixtral.py``, which takes one helper from transformers'
``image_processing_pixtral``, a module that imports torchvision at its top. transformers ships a twin
without torchvision, ``image_processing_pil_pixtral``, that defines the same helpers. Where torchvision
is missing, the finder below serves the twin's names under the first module's name; where torchvision
is installed it does nothing.

This folder goes first on ``PYTHONPATH`` (``test_vllm_cpu_vision_model.py``), so every process vLLM
starts (the model-inspection subprocess, the engine core) runs this file at start-up; the test process
itself runs ``install()``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

TARGET = "transformers.models.pixtral.image_processing_pixtral"
TWIN = "transformers.models.pixtral.image_processing_pil_pixtral"


class PixtralTwinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``TARGET`` as a module holding ``TWIN``'s names when torchvision cannot be found."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET or importlib.util.find_spec("torchvision") is not None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        twin = importlib.import_module(TWIN)
        module.__dict__.update({k: v for k, v in vars(twin).items() if not k.startswith("__")})


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(type(finder).__name__ == PixtralTwinFinder.__name__ for finder in sys.meta_path):
        sys.meta_path.insert(0, PixtralTwinFinder())


install()
