"""Mirror of ``vllm.lora``."""
