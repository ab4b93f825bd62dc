"""Output formatting shared by every API dialect: the ``Formatter`` base class and the error
accessors (``base.py``), LMI's own formats and the helpers other dialects build on (``lmi.py``,
``sse.py``) and custom formatters from model.py (``custom.py``).

Formatters are pure functions from a request's ``RequestOutput`` to body text, called once per
scheduler step; the registry by name, over every dialect, is ``djl_handlers.dialects.registry``.
See ``docs/schema.md`` for every format's bytes and ``docs/deviations.md`` for where they differ
from LMI v0.27. Importing this package does no work.
"""

from djl_handlers.formatting.base import Formatter
from djl_handlers.formatting.custom import CustomFormatter, is_legacy_formatter

__all__ = ["CustomFormatter", "Formatter", "is_legacy_formatter"]
