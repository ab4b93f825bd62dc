"""Log set-up for ``djl-handlers serve``: plain text (default) or JSON lines (``--log-format json``).

In JSON mode every record is one object: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
and, when the record is about a request, ``request_id`` and the finished-request fields
(``status``, ``prompt_tokens``, ``generated_tokens``, ``ttft_ms``, ``total_ms``, ``finish_reason``...).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

__all__ = ["JsonFormatter", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        """``record`` as a JSON line (exceptions under ``exc_info``)."""
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            data["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """Root logging to stderr in ``log_format`` (``text`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
