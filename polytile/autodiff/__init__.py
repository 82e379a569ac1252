"""Reverse-mode automatic differentiation of TC functions, at the TC level: the
gradient of a function is another TC function (see reverse.py), compiled, tuned
and cached like any other."""
from polytile.autodiff.reverse import Backward, backward, forward_saving

__all__ = ["Backward", "backward", "forward_saving"]
