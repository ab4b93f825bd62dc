"""djl_handlers.dialects: the API dialects besides LMI's own schema, one package each, with the request
parsing, the response formatting and (OpenAI) tool calling of that dialect:

* :mod:`.openai` — chat completions and completions (``/v1/...``), tools;
* :mod:`.tgi` — text-generation-inference's ``/generate`` and ``/generate_stream``;
* :mod:`.bedrock` — Bedrock-style ``3p`` bodies and answers (``option.bedrock_compat``).

LMI's own schema is the base they build on (``request.parser``, ``formatting``). Across dialects:
:mod:`.dispatch` picks an item's dialect and parses it, :mod:`.registry` names every formatter.
Importing this package does no work.
"""
