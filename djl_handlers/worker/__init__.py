"""djl_handlers.worker: our Python worker process speaking DJL Serving's socket protocol.

``python -m djl_handlers.worker --sock-type unix --sock-name PATH --model-dir DIR --entry-point EP
--device-id N`` takes the same arguments as DJL's ``djl_python_engine.py``, so either can serve a
model for DJL Serving or for ``djl-handlers serve``. :mod:`.process` is the process (socket, frame
loop), :mod:`.stepping` the worker-driven rolling batch, :mod:`.loader` entry-point loading and the
return-value mapping, shared with :mod:`.in_process`, the in-process transport of ``djl-handlers
generate``. The protocol both sides speak is :mod:`djl_handlers.protocol`.
"""
