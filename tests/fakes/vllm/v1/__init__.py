"""Mirror of ``vllm.v1``."""
