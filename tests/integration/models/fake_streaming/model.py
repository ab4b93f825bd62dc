"""Fake streaming handler (non-rolling ``add_stream_content``): one chunk per word of ``inputs``.

``parameters.fail_after=K`` makes the generator raise after K words (error text ends the stream).
"""

import json

from djl_handlers.io import Output


def _words(words, fail_after):
    for index, word in enumerate(words):
        if fail_after is not None and index >= fail_after:
            raise RuntimeError("fake stream failure")
        yield word


def handle(inputs):
    """Stream the words of the prompt."""
    if inputs.is_empty():
        return None
    body = json.loads(inputs.get_as_string("data"))
    words = body.get("inputs", "").split()
    fail_after = body.get("parameters", {}).get("fail_after")
    out = Output()
    out.add_property("Content-Type", "application/jsonlines")
    out.add_stream_content(_words(words, fail_after))
    return out
