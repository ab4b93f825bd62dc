"""Output formatters: pure functions from a request's ``RequestOutput`` to body text.

``get_formatter(spec, stream=..., tgi_compat=...)`` returns a ``Formatter`` (``.name``,
``.content_type``, ``__call__(out) -> str``) that the scheduler calls once per step; see
``docs/schema.md`` for every format's bytes and ``docs/deviations.md`` for where they differ
from LMI v0.27. Importing this package does no work.
"""

from djl_handlers.formatting.base import Formatter
from djl_handlers.formatting.registry import (
    CustomFormatter,
    allowed_names,
    content_type_for,
    get_formatter,
    is_legacy_formatter,
)

__all__ = [
    "CustomFormatter",
    "Formatter",
    "allowed_names",
    "content_type_for",
    "get_formatter",
    "is_legacy_formatter",
]
