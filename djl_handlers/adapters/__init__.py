"""LoRA adapters: DJL's adapter API (register/update/unregister), the per-service registry, and the
adapter a request selects. Engine-side LoRA lives in ``djl_handlers.engines.lora_*``."""
