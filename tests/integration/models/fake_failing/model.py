"""Fake handler whose initialization fails with a clear message."""


def handle(inputs):
    """Fail on the init call."""
    raise ValueError("fake init failure: option.model_id is missing")
