"""The C helper functions generated kernels call, and which of them a kernel needs.

Each helper is a named piece of C text with the helpers it depends on. The code
generator records the names it uses and `prelude` emits just those (plus their
dependencies, in a fixed order), so a small kernel stays small to read.

The helpers pin down behaviour that plain C leaves undefined or that differs from
the semantics in `polytile.ir.intrinsics`:

* float16/bfloat16 are stored as `uint16_t` and computed in float; conversions
  round to nearest even, handle subnormals, infinities and NaN, and a double is
  narrowed through float with round-to-odd so it is rounded only once;
* signed integer division by 0 gives 0 and INT_MIN / -1 wraps (both trap in C);
* float-to-integer conversion truncates and never hits C's undefined behaviour
  (NaN and out-of-range values give what NumPy gives on x86);
* `pt_max_f32` & co. propagate NaN, as NumPy's max/min reductions do;
* `pt_fail` records the first run-time failure; it is safe to call from OpenMP threads;
* `pt_pool_take`/`pt_pool_give` keep a kernel's top-level local buffers between calls
  (see `polytile.codegen.c`); they are safe to call from several threads at once.
"""
from __future__ import annotations

from polytile.dtypes import DType

_HEADER = """\
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PT_ERR_INDEX 1   /* a data-dependent subscript is out of range */
#define PT_ERR_NOMEM 2   /* a local buffer could not be allocated */
"""

_F16 = """\
static inline float pt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        f = (float)mant * 0x1p-24f;   /* zero or subnormal: exact */
        return sign ? -f : f;
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t pt_f32_to_f16(float f)
{
    uint32_t x, sign, absx, e, m, shift, q, rem, half;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u)                  /* NaN stays NaN (quiet, keeps high payload) */
        return (uint16_t)(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));
    if (absx >= 0x477ff000u)                 /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (absx >= 0x38800000u) {               /* normal: rebias, round to nearest even */
        absx -= 0x38000000u;
        absx += 0xfffu + ((absx >> 13) & 1u);
        return (uint16_t)(sign | (absx >> 13));
    }
    e = absx >> 23;
    if (e < 102u)                            /* below 2^-25: rounds to zero */
        return (uint16_t)sign;
    m = (absx & 0x7fffffu) | 0x800000u;      /* subnormal half: m * 2^(e-126) units of 2^-24 */
    shift = 126u - e;
    q = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

static inline float pt_round_f16(float f)
{
    return pt_f16_to_f32(pt_f32_to_f16(f));
}
"""

_BF16 = """\
static inline float pt_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t pt_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)     /* NaN: keep it quiet */
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float pt_round_bf16(float f)
{
    return pt_bf16_to_f32(pt_f32_to_bf16(f));
}
"""

# Rounding double -> float to odd and then float -> half/bfloat16 to nearest even
# equals rounding double -> half directly, since float has >= 2 more bits.
_F64_ODD = """\
static inline float pt_f64_to_f32_odd(double d)
{
    float f = (float)d;
    uint32_t u;
    if ((double)f != d && d == d) {
        memcpy(&u, &f, sizeof u);
        if (fabs((double)f) > fabs(d))
            u -= 1u;                         /* truncate toward zero ... */
        u |= 1u;                             /* ... and keep the lost bits as a sticky bit */
        memcpy(&f, &u, sizeof f);
    }
    return f;
}
"""

_F64_TO_F16 = """\
static inline float pt_round_f16_d(double d)
{
    return pt_round_f16(pt_f64_to_f32_odd(d));
}
"""

_F64_TO_BF16 = """\
static inline float pt_round_bf16_d(double d)
{
    return pt_round_bf16(pt_f64_to_f32_odd(d));
}
"""

# The results for NaN and out-of-range values are those of x86's cvttsd2si (the
# "integer indefinite" INT_MIN of the conversion's width), as NumPy gives there.
_F2I = """\
static inline int32_t pt_f2i32(double x)
{
    return (x >= -2147483648.0 && x < 2147483648.0) ? (int32_t)x : INT32_MIN;
}

static inline int64_t pt_f2i64(double x)
{
    return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (int64_t)x : INT64_MIN;
}

static inline uint64_t pt_f2u64(double x)
{
    return (x >= 9223372036854775808.0 && x < 18446744073709551616.0) ? (uint64_t)x
                                                                       : (uint64_t)pt_f2i64(x);
}
"""

_MINMAX_NAN = """\
static inline float pt_max_f32(float a, float b) { return (b > a || b != b) ? b : a; }
static inline float pt_min_f32(float a, float b) { return (b < a || b != b) ? b : a; }
static inline double pt_max_f64(double a, double b) { return (b > a || b != b) ? b : a; }
static inline double pt_min_f64(double a, double b) { return (b < a || b != b) ? b : a; }
"""

_BOUNDS = """\
static inline int64_t pt_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t pt_max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t pt_floordiv_i64(int64_t a, int64_t b)   /* b > 0 */
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}
static inline int64_t pt_ceildiv_i64(int64_t a, int64_t b)    /* b > 0 */
{
    return -pt_floordiv_i64(-a, b);
}
"""

_FAIL = """\
static void pt_fail(int32_t *status, int64_t *err, int32_t code, int64_t buffer, int64_t dim,
                    int64_t value)
{
#ifdef _OPENMP
#pragma omp critical(pt_fail)
#endif
    {
        if (*status == 0) {
            *status = code;
            err[0] = code;
            err[1] = buffer;
            err[2] = dim;
            err[3] = value;
        }
    }
}
"""

# A kernel's top-level heap buffers are kept between calls in a few slots per buffer
# (`static void *pt_pool_l0[PT_POOL_SLOTS]` in the kernel's source). A call takes a
# cached block, or allocates one; at the end it puts it back in an empty slot, or frees
# it when all are taken (more callers at once than slots). A slot only ever changes by
# one atomic exchange, so concurrent calls never share a block and no lock is needed.
# Blocks start on a page boundary: with plain malloc a block's offset within a cache
# line and a page depended on the allocation history of the process, and identical
# kernels (tmm 1024x1024x1024, three copies timed together) ran 27.4, 33.3 and 34.5 ms;
# page-aligned, 32.0-32.3 ms.
_POOL = """\
#define PT_POOL_SLOTS 8
#define PT_POOL_ALIGN 4096

/* count * size zeroed bytes on a PT_POOL_ALIGN boundary (C99 has no aligned allocation):
   the allocated pointer is kept in the word before the block, for pt_pool_free. Zeroed,
   so that a kept block's state (polytile.loops.nodes.Kept) starts as "not filled". */
static void *pt_pool_alloc(size_t count, size_t size)
{
    if (size != 0 && count > (SIZE_MAX - PT_POOL_ALIGN - sizeof(void *)) / size)
        return NULL;
    unsigned char *raw = calloc(count * size + PT_POOL_ALIGN + sizeof(void *), 1);
    if (raw == NULL)
        return NULL;
    uintptr_t start = ((uintptr_t)(raw + sizeof(void *)) + PT_POOL_ALIGN - 1)
                      & ~(uintptr_t)(PT_POOL_ALIGN - 1);
    ((void **)start)[-1] = raw;
    return (void *)start;
}

static void pt_pool_free(void *p)
{
    if (p != NULL)
        free(((void **)p)[-1]);
}

static void *pt_pool_take(void **slots, size_t count, size_t size)
{
    for (int k = 0; k < PT_POOL_SLOTS; k++) {
        void *p = __atomic_exchange_n(&slots[k], NULL, __ATOMIC_ACQUIRE);
        if (p != NULL)
            return p;
    }
    return pt_pool_alloc(count, size);
}

static void pt_pool_give(void **slots, void *p)
{
    if (p == NULL)
        return;
    for (int k = 0; k < PT_POOL_SLOTS; k++) {
        void *empty = NULL;
        if (__atomic_compare_exchange_n(&slots[k], &empty, p, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
            return;
    }
    pt_pool_free(p);
}

static void pt_pool_drain(void **slots)
{
    for (int k = 0; k < PT_POOL_SLOTS; k++)
        pt_pool_free(__atomic_exchange_n(&slots[k], NULL, __ATOMIC_ACQUIRE));
}
"""


def _int_div_mod(dt: DType) -> str:
    """`pt_div_<t>`/`pt_mod_<t>`: C's truncating division, with x/0 = x%0 = 0."""
    t, s = dt.c_name, suffix(dt)
    if dt.kind == "u":
        return (f"static inline {t} pt_div_{s}({t} a, {t} b) {{ return b == 0 ? 0 : "
                f"({t})(a / b); }}\n"
                f"static inline {t} pt_mod_{s}({t} a, {t} b) {{ return b == 0 ? 0 : "
                f"({t})(a % b); }}\n")
    wide = "uint64_t" if dt.bits == 64 else "uint32_t"
    # b == -1 is split off because INT_MIN / -1 overflows (and traps on x86).
    return (f"static inline {t} pt_div_{s}({t} a, {t} b)\n{{\n"
            f"    return b == 0 ? 0 : b == -1 ? ({t})(0u - ({wide})a) : ({t})(a / b);\n}}\n"
            f"static inline {t} pt_mod_{s}({t} a, {t} b)\n{{\n"
            f"    return (b == 0 || b == -1) ? 0 : ({t})(a % b);\n}}\n")


def suffix(dt: DType) -> str:
    """Short type tag used in helper names: i32, u8, ..."""
    return f"{'u' if dt.kind in 'ub' else 'i'}{dt.bits}"


# name -> (dependencies, text); the order here is the order of emission.
_HELPERS: dict[str, tuple[tuple[str, ...], str]] = {
    "f16": ((), _F16),
    "bf16": ((), _BF16),
    "f64_odd": ((), _F64_ODD),
    "f64_to_f16": (("f16", "f64_odd"), _F64_TO_F16),
    "f64_to_bf16": (("bf16", "f64_odd"), _F64_TO_BF16),
    "f2i": ((), _F2I),
    "minmax_nan": ((), _MINMAX_NAN),
    "bounds": ((), _BOUNDS),
    "fail": ((), _FAIL),
    "pool": ((), _POOL),
}


def div_helper(dt: DType) -> str:
    """The helper name that provides pt_div_/pt_mod_ for integer type `dt`."""
    return f"divmod_{suffix(dt)}"


def prelude(used: set[str], int_types: dict[str, DType]) -> str:
    """The header and the helpers in `used` (with dependencies), as C text.

    `int_types` maps divmod helper names (see `div_helper`) to their dtype.
    """
    text = helpers(used, int_types)
    return "\n".join([_HEADER, text] if text else [_HEADER])


def helpers(used: set[str], int_types: dict[str, DType]) -> str:
    """The helpers in `used` (with dependencies) without the C header: the OpenCL printer
    (polytile.codegen.opencl) puts its own header before the same helpers."""
    wanted: set[str] = set()

    def want(name: str) -> None:
        if name not in wanted:
            wanted.add(name)
            for dep in _HELPERS.get(name, ((), ""))[0]:
                want(dep)

    for name in used:
        want(name)
    parts = [text for name, (_, text) in _HELPERS.items() if name in wanted]
    parts += [_int_div_mod(int_types[name]) for name in sorted(wanted) if name in int_types]
    unknown = wanted - set(_HELPERS) - set(int_types)
    assert not unknown, f"unknown C helpers {sorted(unknown)}"
    return "\n".join(parts)
