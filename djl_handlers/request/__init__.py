"""LMI's request records and its parser: one Input item's body -> a ``Request`` or a per-request error."""
