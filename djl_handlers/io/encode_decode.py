"""Content-type dispatch for request bodies and responses: ``djl_python.encode_decode``'s API.

:func:`decode` turns an ``Input``'s body into the value a handler works on (JSON, text, CSV, image,
audio bytes, numpy arrays); :func:`encode` adds a prediction to an ``Output`` in the requested
content type and sets ``Content-Type``. Same dispatch as DJL v0.35+ (``require_headers`` /
``require_csv_headers`` included), which is a superset of v0.27's. Unlike DJL's v0.27-0.34 copy,
:func:`decode_csv` works, and :func:`encode` for ``text/csv`` finds ``Output.add_as_string``.
numpy is imported only for header-less (numeric) CSV.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["decode", "decode_csv", "encode", "encode_csv"]

_CSV_HEADERS = ("question", "context", "inputs")


def decode_csv(inputs: Any, require_headers: bool = True) -> Any:
    """A CSV body: ``{"inputs": [...]}`` from a header row, or a numeric numpy array without one.

    With headers, one of the columns must be ``question``, ``context`` or ``inputs``: an ``inputs``
    column gives the list of its values, otherwise every row is a dict. ``ValueError`` otherwise.
    Without headers the body must be all numbers (``numpy.genfromtxt``, comma-separated).
    """
    text: str = inputs.get_as_string()
    if not require_headers:
        import numpy

        result = numpy.genfromtxt(io.StringIO(text), delimiter=",")
        if numpy.isnan(result).any():
            raise ValueError("CSV contains non-numeric data. Please provide numeric data only.")
        return result
    lines = text.splitlines()
    header = lines[0].lower() if lines else ""
    if not any(name in header for name in _CSV_HEADERS):
        raise ValueError(
            "You need to provide the correct CSV with Header columns to use it with the inference "
            f"toolkit default handler (one of {', '.join(_CSV_HEADERS)})."
        )
    rows = list(csv.DictReader(io.StringIO(text)))
    if rows and "inputs" in rows[0]:
        return {"inputs": [row["inputs"] for row in rows]}
    return {"inputs": rows}


def encode_csv(content: Iterable[Mapping[str, Any]]) -> str:
    """Rows (dicts) as CSV text with a header row taken from the first row's keys."""
    rows = content if isinstance(content, list) else list(content)
    if not rows:
        return ""
    stream = io.StringIO()
    writer = csv.DictWriter(stream, list(rows[0].keys()))
    writer.writeheader()
    writer.writerows(rows)
    return stream.getvalue()


def decode(inputs: Any, content_type: str | None, key: str | None = None, require_csv_headers: bool = True) -> Any:
    """The body of ``inputs`` (entry ``key``) decoded according to ``content_type``.

    No content type: JSON, or ``{"inputs": ""}`` for an empty body. ``application/json``: the JSON
    value. ``text/csv``: :func:`decode_csv`. ``text/plain``: ``{"inputs": [text]}``. ``image/*``:
    ``{"inputs": PIL image}``. ``audio/*``: ``{"inputs": bytes}``. ``tensor/npz``, ``tensor/ndlist``,
    ``application/x-npy``: ``{"inputs": [arrays]}``. ``application/x-www-form-urlencoded``:
    ``{"inputs": text}``. Anything else: ``{"inputs": bytes}``.
    """
    if not content_type:
        if not inputs.get_as_bytes(key=key):
            return {"inputs": ""}
        return inputs.get_as_json(key=key)
    if "application/json" in content_type:
        return inputs.get_as_json(key=key)
    if "text/csv" in content_type:
        return decode_csv(inputs, require_headers=require_csv_headers)
    if "text/plain" in content_type:
        return {"inputs": [inputs.get_as_string(key=key)]}
    if content_type.startswith("image/"):
        return {"inputs": inputs.get_as_image(key=key)}
    if content_type.startswith("audio/"):
        return {"inputs": inputs.get_as_bytes(key=key)}
    if "tensor/npz" in content_type:
        return {"inputs": inputs.get_as_npz(key=key)}
    if content_type in ("tensor/ndlist", "application/x-npy"):
        return {"inputs": inputs.get_as_numpy(key=key)}
    if content_type == "application/x-www-form-urlencoded":
        return {"inputs": inputs.get_as_string(key=key)}
    return {"inputs": inputs.get_as_bytes(key=key)}


def encode(outputs: Any, prediction: Any, content_type: str | None, key: str | None = None) -> None:
    """Add ``prediction`` to ``outputs`` (entry ``key``) and set its ``Content-Type``.

    No content type or ``application/json``: JSON. ``text/csv``: :func:`encode_csv` of the rows.
    ``tensor/npz``: an npz archive. Anything else: a DJL NDList (``tensor/ndlist``).
    """
    if not content_type or "application/json" in content_type:
        outputs.add_as_json(prediction, key=key)
        outputs.add_property("Content-Type", "application/json")
    elif "text/csv" in content_type:
        outputs.add_as_string(encode_csv(prediction), key=key)
        outputs.add_property("Content-Type", "text/csv")
    elif "tensor/npz" in content_type:
        outputs.add_as_npz(prediction, key=key)
        outputs.add_property("Content-Type", "tensor/npz")
    else:
        outputs.add_as_numpy(prediction, key=key)
        outputs.add_property("Content-Type", "tensor/ndlist")
