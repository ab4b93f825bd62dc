"""djl_handlers.protocol: DJL's worker protocol as the front end and the worker both speak it, without I/O.

* :mod:`.messages` — one HTTP request as DJL's ``Input`` (:class:`~.messages.WorkerRequest`), one reply,
  the ``batch_NNN.`` naming and :class:`~.messages.BatchFailure`;
* :mod:`.dynamic` — dynamic-batch frames and the split of their replies (``PyPredictor``);
* :mod:`.rolling` — the rolling-batch step loop state (``RollingBatch.java``) and its records;
* :mod:`.worker_steps` — the delta frames of a rolling batch driven by our own worker;
* :mod:`.transport` — "one frame in, one reply out" (:class:`~.transport.Transport`) and an in-memory sink;
* :mod:`.startup` — what a worker prints when it is ready and the entry point it falls back to.

The frame codec itself is :mod:`djl_handlers.io.wire`. ``djl_handlers.server`` (the front end) and
``djl_handlers.worker`` (the worker process) both import this package; neither imports the other.
"""
