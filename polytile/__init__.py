"""polytile: a tensor compiler for Python (Tensor Comprehensions -> nested polyhedral IR -> C)."""
from polytile import tune
from polytile.api import Module, TCFunction, define, grad
from polytile.einsum import einsum
from polytile.errors import (ArgumentError, BuildError, CausalityError, IRError, KernelError,
                             NameResolutionError, OutOfBoundsError, ParseError, PolytileError,
                             RangeInferenceError, TypeCheckError, UnsupportedError)

__version__ = "0.1.0"

__all__ = ["define", "einsum", "grad", "tune", "Module", "TCFunction", "PolytileError",
           "ParseError",
           "NameResolutionError", "TypeCheckError", "RangeInferenceError", "OutOfBoundsError",
           "CausalityError", "ArgumentError", "IRError", "BuildError", "KernelError",
           "UnsupportedError"]
