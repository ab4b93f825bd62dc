"""Tests of the parsers of model output, with a corpus shared by our tests and vLLM's."""
