"""Small native kernels built at first use (see :mod:`djl_handlers.kernels.build`)."""
