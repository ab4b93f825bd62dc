"""djl_handlers.io: DJL's ``Input``/``Output``/``PairList`` API and the binary wire codec.

``from djl_handlers.io import Input, Output, PairList`` gives our implementations of
``djl_python``'s classes; :mod:`djl_handlers.io.compat` picks DJL's own when they are importable;
:mod:`djl_handlers.io.wire` encodes and decodes the socket frames; :mod:`djl_handlers.io.ndlist`
(djl_python's ``np_util``) and :mod:`djl_handlers.io.encode_decode` complete the djl_python API.
"""

from djl_handlers.io.inputs import Input
from djl_handlers.io.outputs import Output
from djl_handlers.io.pair_list import PairList

__all__ = ["Input", "Output", "PairList"]
