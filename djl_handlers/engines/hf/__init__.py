"""The transformers (HF) engine: continuous batching over the model's forward, its loader and helpers."""
