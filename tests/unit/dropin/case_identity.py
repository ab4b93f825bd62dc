"""Guards: the ``djl_python`` under test is the shim over ``djl_handlers.io``, not DJL's own."""

from __future__ import annotations

import djl_python
import djl_python.encode_decode
import djl_python.inputs
import djl_python.np_util
import djl_python.outputs
import djl_python.pair_list

import djl_handlers.io
from djl_handlers.io import encode_decode, ndlist


def test_djl_python_is_our_shim() -> None:
    assert djl_python.Input is djl_handlers.io.Input
    assert djl_python.inputs.Input is djl_handlers.io.Input
    assert djl_python.outputs.Output is djl_handlers.io.Output
    assert djl_python.PairList is djl_python.pair_list.PairList is djl_handlers.io.PairList
    assert djl_python.np_util is ndlist
    assert djl_python.encode_decode is encode_decode
    import djl_python.test_model as test_model

    assert test_model.Input is djl_handlers.io.Input and test_model.to_nd_list is ndlist.to_nd_list
