"""Mirror of ``vllm.engine``."""
