"""LMI's stateful sessions (``option.enable_stateful_sessions``): the session store
(:mod:`.store`) and the async-mode gate that answers ``requestType`` NEW_SESSION/CLOSE and routes
requests carrying the ``X-Amzn-SageMaker-Session-Id`` header (:mod:`.gate`)."""
