"""Parsers of model output: reasoning (:mod:`.reasoning`) and tool calls (:mod:`.tools`), one
module per model family behind one registry (:mod:`.registry`) with vLLM's names.

A parser reads the text a model generated, never token ids, so it needs no model and no ML
library: the same parser serves every engine. Each parser is a pure function of the text so far
(``final`` says whether more may come) whose results only grow as the text grows, so a stream is
the difference between two readings (:mod:`.stream`).
"""
