"""The names by which djl_handlers extends DJL's protocol (DJL's own code ignores every one).

- ``CANCEL_PROPERTY``: the front end sets ``batch_NNN.djl_handlers_cancel=true`` on a rolling-batch
  slot whose client went away; our handlers finish that slot within the step (``last=true``).
- ``API_PROPERTY``: the local server's OpenAI and TGI routes set this request property to the body's
  dialect (``chat``, ``completion``, ``tgi``, ``tgi_stream``).
- ``STATS_RECORD_KEY``: a key of a rolling-batch request's *last* record (``Output.binary_encode``):
  compact JSON ``{"prompt_tokens": int, "generated_tokens": int, "finish_reason": str}``. DJL's Java
  ``RollingBatch`` reads only ``data``/``last``/``code``/``error`` from a record and skips the rest
  (as it skips ``step_token_num``), so the key is harmless there; the local server turns it into the
  per-request token histograms and the finished-request log line.
- ``ENGINE_STATS_PROPERTY``: an output property of a rolling-batch step reply (not ``batch_``-prefixed,
  so DJL's ``RollingBatch`` ignores it; it copies only ``batch_{i}_*`` properties into headers):
  compact JSON of the engine's own figures, e.g. ``{"kv_cache_usage": 0.42,
  "kv_cache_used_bytes": ..., "kv_cache_allocated_bytes": ..., "batch_size": 3}``. Sent on the first
  step, every ``ENGINE_STATS_EVERY_STEPS`` steps and when the batch becomes empty.

- In async mode (``option.async_mode=true``) ``CANCEL_PROPERTY`` is a request property whose value
  is the ``request_tracking_id`` of another request: the handler finishes that request in the engine
  and answers the cancel frame itself with ``None`` (DJL's engine makes it a 204 the front end
  ignores). A cancel frame's own ``request_tracking_id`` starts with ``CANCEL_TRACKING_PREFIX``; the
  front end sets that id on every frame, so a client's ``djl_handlers_cancel`` header on its own
  request is inert, as in rolling-batch mode. ``ENGINE_STATS_PROPERTY`` is then a key of a reply's
  record (DJL's Java ``Request.addResponse`` reads only ``data``/``last``/``code``/``error`` and
  skips the rest, whereas an Output property would become an HTTP header).

- ``QUERY_HANDLER``: a handler function name (the ``handler`` property of a call, as DJL's adapter
  calls name theirs) that the local server calls outside inference for its ``/tokenize``,
  ``/detokenize``, ``/info`` and ``/v1/models`` routes; property ``op`` names the question
  (:mod:`djl_handlers.queries`). DJL's front end never calls it.

- ``STATUS_PROPERTY``: a dynamic-batch reply's ``batch_{i}_djl_handlers_status`` property: request i's
  HTTP status (the pooling kinds set it for a request that failed beside others that succeed). DJL's
  front end answers every request of a batch with the frame's code; the local server reads it.

DJL's own names reused here (not extensions): property ``requestId`` (DJL's front end adds it to
every request's Input), record key ``step_token_num`` (DJL's Python rolling batch writes it) and, in
async mode, property ``request_tracking_id`` (DJL's ``AsyncRequestManager`` tags every request and
expects it on every reply).
"""

CANCEL_PROPERTY = "djl_handlers_cancel"
CANCEL_TRACKING_PREFIX = "cancel-"  # async mode: the request_tracking_id of a cancel frame
API_PROPERTY = "X-Djl-Handlers-Api"
STATS_RECORD_KEY = "djl_handlers_stats"
ENGINE_STATS_PROPERTY = "djl_handlers_engine_stats"
ENGINE_STATS_EVERY_STEPS = 16
QUERY_HANDLER = "djl_handlers_query"
STATUS_PROPERTY = "djl_handlers_status"  # dynamic batch: batch_{i}_djl_handlers_status, request i's HTTP status

REQUEST_ID_PROPERTY = "requestId"  # DJL 0.34's front end: Input property carrying x-request-id
STEP_TOKENS_KEY = "step_token_num"  # DJL's Python rolling batch: tokens this step added
TRACKING_ID_PROPERTY = "request_tracking_id"  # DJL's async mode: one id per request and its replies
