"""The error side of the generated C calling convention, for the Python caller.

A kernel returns 0 or one of the codes below and fills `err[0..3]` =
(code, position of the buffer in `Function.params` or -1, dimension, value).
`kernel_error` turns that into the `KernelError` a user sees.
"""
from __future__ import annotations

from collections.abc import Sequence

from polytile.errors import KernelError
from polytile.ir.nodes import Function

ERR_INDEX = 1     # a data-dependent subscript is out of range; value = the subscript
ERR_NOMEM = 2     # a local buffer could not be allocated; value = its size in bytes
ERR_WORDS = 4     # int64 entries the caller provides in `err`


def kernel_error(fn: Function, status: int, err: Sequence[int]) -> KernelError:
    """The error for a kernel of `fn` that returned `status` with `err` filled."""
    code, buffer, dim, value = (int(x) for x in err[:ERR_WORDS])
    if status == ERR_NOMEM:
        return KernelError(f"{fn.name}: out of memory allocating a {value}-byte local buffer")
    if status != ERR_INDEX or code != status:
        return KernelError(f"{fn.name}: kernel failed with code {status}")
    if 0 <= buffer < len(fn.params):
        name = fn.params[buffer]
        sizes = fn.body.ref(name).shape.sizes
        size = f" (size {sizes[dim]})" if 0 <= dim < len(sizes) else ""
        where = f"dimension {dim} of tensor {name!r}{size}"
    else:
        where = f"dimension {dim} of a temporary buffer"
    return KernelError(f"{fn.name}: index {value} is out of range for {where}",
                       hint="a subscript computed from data (a gather) must lie in the "
                            "tensor's range; check the index tensor's values")
