"""LoRA adapters: DJL's adapter API (register/update/unregister), the per-service registry, the adapter
a request selects, and the ``LoRARequest`` objects of engines that apply adapters themselves
(``external``). The HF engine's weights and per-row hooks are in ``djl_handlers.engines.hf.lora``."""
