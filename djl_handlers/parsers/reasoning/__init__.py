"""Reasoning parsers: split a reply into the model's reasoning and its answer (``content``).

One module per family: :mod:`.think` (``<think>`` tags: DeepSeek-R1, Qwen3 and kin),
:mod:`.granite` (Granite's plain-text headings), :mod:`.harmony` (gpt-oss channels). Registered
under vLLM's names in :mod:`djl_handlers.parsers.registry`.
"""
