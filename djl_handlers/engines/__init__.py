"""Engines: the protocol (``base``), the lazy registry, the fake engine; ``hf/`` and ``external/`` families."""
