"""How a worker process starts, as DJL's front end and ours both expect it: our worker's module
(``python -m djl_handlers.worker``), the line a worker prints when its socket listens, and the entry
point a model file without a handler function falls back to (DJL 0.34 passes it as
``--recommended-entry-point``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["STARTED_LINE", "WORKER_MODULE", "recommended_for"]

WORKER_MODULE = "djl_handlers.worker"  # run with ``python -m``; takes DJL's worker arguments
STARTED_LINE = "Python engine started."
_LOG = logging.getLogger(__name__)


def recommended_for(entry_point: str, model_dir: str | os.PathLike[str]) -> str | None:
    """The handler a model file falls back to when it has no handler function (``None`` if none).

    Only a model file (``model.py``) falls back; it is computed from the model directory's
    serving.properties + env (``config.properties.recommended_entry_point``).
    """
    if not entry_point.endswith(".py"):
        return None
    from djl_handlers.config.properties import recommended_for_model_dir

    try:
        return recommended_for_model_dir(Path(model_dir))
    except Exception:  # an unreadable serving.properties: no fallback, the missing function is reported
        _LOG.exception("cannot compute the recommended entry point for %s", model_dir)
        return None
