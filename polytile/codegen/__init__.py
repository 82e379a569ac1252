"""Code generation from the IR: C99 (+OpenMP) today."""
from polytile.codegen.c import COptions, CSource, generate_c, print_c
from polytile.codegen.cabi import ERR_INDEX, ERR_NOMEM, ERR_WORDS, kernel_error

__all__ = [
           "ERR_INDEX",
           "ERR_NOMEM",
           "ERR_WORDS",
           "COptions",
           "CSource",
           "generate_c",
           "print_c",
           "kernel_error",
]
