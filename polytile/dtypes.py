"""Scalar types: TC spellings, NumPy and C equivalents, promotion."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str          # canonical TC name, e.g. "float32"
    kind: str          # "b" bool, "u" unsigned, "i" signed, "f" floating
    bits: int
    c_name: str        # C storage type
    np_name: str

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_integral(self) -> bool:
        return self.kind in "bui"

    @property
    def numpy(self) -> np.dtype:
        if self.name == "bfloat16":
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.np_name)

    def __str__(self) -> str:
        return self.name


BOOL = DType("bool", "b", 8, "uint8_t", "bool")
UINT8 = DType("uint8", "u", 8, "uint8_t", "uint8")
UINT16 = DType("uint16", "u", 16, "uint16_t", "uint16")
UINT32 = DType("uint32", "u", 32, "uint32_t", "uint32")
UINT64 = DType("uint64", "u", 64, "uint64_t", "uint64")
INT8 = DType("int8", "i", 8, "int8_t", "int8")
INT16 = DType("int16", "i", 16, "int16_t", "int16")
INT32 = DType("int32", "i", 32, "int32_t", "int32")
INT64 = DType("int64", "i", 64, "int64_t", "int64")
FLOAT16 = DType("float16", "f", 16, "uint16_t", "float16")
BFLOAT16 = DType("bfloat16", "f", 16, "uint16_t", "bfloat16")
FLOAT32 = DType("float32", "f", 32, "float", "float32")
FLOAT64 = DType("float64", "f", 64, "double", "float64")

ALL = (BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64,
       FLOAT16, BFLOAT16, FLOAT32, FLOAT64)

_BY_NAME = {t.name: t for t in ALL}
# The TC paper's spellings.
_ALIASES = {"float": FLOAT32, "double": FLOAT64, "half": FLOAT16, "int": INT32,
            "byte": UINT8, "long": INT64}

TYPE_NAMES = frozenset(_BY_NAME) | frozenset(_ALIASES)


def lookup(name: str) -> DType | None:
    """The dtype a TC type name denotes, or None."""
    return _BY_NAME.get(name) or _ALIASES.get(name)


def from_numpy(dtype: np.dtype) -> DType | None:
    dtype = np.dtype(dtype)
    if dtype == np.dtype(ml_dtypes.bfloat16):
        return BFLOAT16
    return _BY_NAME.get(dtype.name)


# What a scalar parameter accepts, on every call path: Python and NumPy real numbers and
# booleans. Not complex numbers, strings, bytes, None, sequences or other objects, which
# NumPy would turn into something (an empty array, NaN, a parsed string) without a word.
SCALAR_TYPES = (bool, int, float, np.bool_, np.integer, np.floating, type(ml_dtypes.bfloat16(0)))


@lru_cache(maxsize=None)
def overflow_limit(dtype: DType) -> float:
    """The smallest magnitude that converts to inf in floating-point `dtype` (inf for
    float64), found by bisection over float64 bit patterns, so it is exact for the
    conversion NumPy and ml_dtypes really do (bfloat16 rounds through float32)."""
    if dtype.bits == 64:
        return math.inf
    convert = dtype.numpy.type
    largest = float(ml_dtypes.finfo(dtype.numpy).max)
    lo, hi = (int(np.float64(x).view(np.int64)) for x in (largest, 2 * largest))
    with np.errstate(over="ignore"):
        while hi - lo > 1:     # convert(lo) is finite, convert(hi) is inf
            mid = (lo + hi) // 2
            if math.isinf(float(convert(float(np.int64(mid).view(np.float64))))):
                hi = mid
            else:
                lo = mid
    return float(np.int64(hi).view(np.float64))


def scalar_problem(dtype: DType, value: object) -> tuple[str, str | None] | None:
    """Why `value` cannot be passed as a scalar of `dtype`, as (what is wrong, hint), or
    None when it can. The caller names the parameter."""
    if not isinstance(value, SCALAR_TYPES):
        return (f"must be a {dtype} scalar, got {type(value).__name__}",
                "pass a Python int, float or bool, or a NumPy scalar")
    try:
        number = float(value)
    except OverflowError:
        return f"cannot hold {value} (it is beyond every float)", None
    if dtype.is_float and overflow_limit(dtype) <= abs(number) < math.inf:
        return (f"is {dtype}, which cannot hold {value} (it would become inf)",
                f"finite values must lie within ±{float(ml_dtypes.finfo(dtype.numpy).max):g}")
    if dtype.is_integral:
        if not number.is_integer():
            return f"must be an integer, got {value}", None
        if dtype.kind in "iu":
            info = np.iinfo(dtype.numpy)
            if not info.min <= int(value) <= info.max:
                return (f"is {dtype}, which cannot hold {value}",
                        f"values must lie in {info.min}..{info.max}")
    return None


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary arithmetic operation: int -> float, the wider wins.

    Mixed signed/unsigned integers of the same width widen to the next signed type
    (as NumPy does); float16 with bfloat16 meets at float32.
    """
    if a == b:
        return a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            if a.bits == b.bits:   # float16 vs bfloat16
                return FLOAT32
            return a if a.bits > b.bits else b
        return a if a.is_float else b
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    if a.kind == b.kind:
        return a if a.bits >= b.bits else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.bits > unsigned.bits:
        return signed
    return {8: INT16, 16: INT32, 32: INT64}.get(unsigned.bits, INT64)
