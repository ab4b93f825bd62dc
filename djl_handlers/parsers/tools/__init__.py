"""Tool-call parsers: read a reply's calls in the model's own format, one module per family.

:mod:`.hermes` (``<tool_call>`` JSON blocks: Hermes, Qwen2.5/Qwen3 JSON), :mod:`.llama`
(Llama 3's ``<|python_tag|>`` / bare JSON), :mod:`.mistral` (``[TOOL_CALLS]``), :mod:`.pythonic`
(``[f(a=1)]``), :mod:`.qwen3_xml` (Qwen3-Coder's ``<function=...>`` XML) and :mod:`.plain_json`
(the built-in reading when no parser is configured). JSON scanning of partial text is
:mod:`.json_scan`. Registered under vLLM's names in :mod:`djl_handlers.parsers.registry`.
"""
