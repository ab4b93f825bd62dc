"""Small native kernels built at first use (see :mod:`djl_handlers.kernels.build`), and their names."""

#: Every kernel of the package: ``<name>.c`` (shipped as package data) and the module
#: ``djl_handlers.kernels.<name>`` that loads it (``available()``, ``unavailable_reason()``).
KERNELS: tuple[str, ...] = ("decode_attention", "int8_gemm", "rms_norm", "rotary", "row_stats", "silu_mul")
