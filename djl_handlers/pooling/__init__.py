"""The pooling model kinds beside generation: embeddings (pooled, normalised hidden states) and
reranking (a cross-encoder's relevance scores), with their request records, parsers, formatters per
API dialect, their transformers engine and the service that serves them on every entry point."""
