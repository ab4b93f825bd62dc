"""Images in requests: what a request refers to (``records``), the operator's limits
(:mod:`djl_handlers.config.media`), and turning a reference into a checked, decoded image
(``fetch``: ``data:``, allow-listed ``http(s)`` and ``file:`` URLs; ``images``: decoding within
the pixel and byte caps). Every refusal is an ``InvalidRequest`` (400) naming the request part."""
