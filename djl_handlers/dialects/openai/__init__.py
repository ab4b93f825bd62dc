"""The OpenAI dialect: request bodies (:mod:`.request`), tool fields and tool turns (:mod:`.tools`),
responses (:mod:`.response`, per-request state in :mod:`.state`), replies read back as tool calls
(:mod:`.tool_calls`, streamed by :mod:`.tool_stream`)."""
