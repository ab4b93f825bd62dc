"""Package version, kept apart so setup.py can read it without importing anything."""

__version__ = "0.1.0"
