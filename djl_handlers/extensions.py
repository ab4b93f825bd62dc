"""The two property names by which djl_handlers extends DJL's protocol (DJL's own code ignores both).

- ``CANCEL_PROPERTY``: the front end sets ``batch_NNN.djl_handlers_cancel=true`` on a rolling-batch
  slot whose client went away; our handlers finish that slot within the step (``last=true``).
- ``API_PROPERTY``: the local server's OpenAI and TGI routes set this request property to the body's
  dialect (``chat``, ``completion``, ``tgi``, ``tgi_stream``).
"""

CANCEL_PROPERTY = "djl_handlers_cancel"
API_PROPERTY = "X-Djl-Handlers-Api"
