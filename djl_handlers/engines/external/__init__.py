"""Adapters of external engine libraries (vLLM, TensorRT-LLM, DeepSpeed) to the engine protocol."""
