"""Vectorizable float32 math for the vector code generator (GCC vector extensions).

Each function works lane by lane on `pt_vf` (float32 x lanes) with plain vector
arithmetic, so GCC keeps everything in registers. Error bounds (measured against
float64 references over the float32 range, see tests/codegen/test_vmath.py):

* exp:  range reduction x = n*ln2 + r, |r| <= ln2/2, degree-7 Taylor polynomial;
        relative error <= 2 ulp; exp(-inf) = 0, exp(+inf) = inf, NaN propagates;
        results below 2^-126 flush to 0 (no subnormals). With AVX-512 (16 lanes)
        2^n p is vscalefps, masked to 0 below the range: 10.5-17.9 cycles a vector
        instead of 17.4-26.4 (L1-resident, one thread, runs alternated on a noisy Intel
        Xeon, 2026-11-27); benchmarks/kernel_ab.py, two threads, 4096^2: softmax
        1.10-1.14x, bias-GELU-residual 1.22-1.24x faster.
* log:  x = m * 2^e with m in [sqrt(1/2), sqrt(2)), degree-9 polynomial in (m - 1)
        (Cephes logf), a subnormal x scaled by 2^23 first; relative error <= 3 ulp;
        log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN propagates.
* tanh: odd polynomial for |x| < 0.625 (Cephes tanhf), 1 - 2/(exp(2|x|) + 1) above;
        absolute error <= 2e-7.
* erf:  x P(x^2) / Q(x^2), P of degree 6 and Q of degree 4, on |x| < 3.92 (beyond it
        +-1), fitted by benchmarks/fit_erf.py (float64 error 5.1e-8); in float32
        absolute error <= 3.5e-7 (3.2e-7 measured; A&S 4.7e-7), relative error <= 1e-6
        as x -> 0 (A&S gave erf(1e-30) = 0).
        Odd, so no sign handling, and no exp: 20-25 TSC cycles a vector against 30-38
        for Abramowitz & Stegun 7.1.26 (1 - P(t) exp(-x^2), t = 1/(1 + 0.33|x|)), which
        it replaced (L1-resident, one thread, runs alternated, Intel Xeon, 2026-11-27).
        An x P(x^2) branch for |x| < 1 beside A&S made GELU 28% slower (every lane
        computes both) and was not taken (one thread, Zen 3, 1024x1024: 3.0 -> 3.85 ms).
* sigmoid: 1 / (1 + exp(-x)); relative error <= 3 ulp.
"""
from __future__ import annotations


def vector_math(lanes: int, streams: bool = False) -> str:
    """C definitions of the vector types and math for `lanes` float32 lanes; with
    `streams`, the streaming store and the fence too."""
    nbytes = 4 * lanes
    splat = ", ".join(["x"] * lanes)
    # Masked moves exist for 16 float lanes (AVX-512) and 8 (AVX); other widths copy
    # lane by lane.
    masked_load = masked_store = ""
    if lanes == 16:
        # the count clamped to [0, 16] first: x86 shifts by the count mod 32, so an n of
        # -3 made a mask of all 16 lanes (a read past p) and one of 32 a mask of none
        masked_load = ("#if defined(__AVX512F__)\n  int64_t k = n < 0 ? 0 : n > 16 ? 16 : n;\n"
                       "  return (pt_vf)_mm512_maskz_loadu_ps((__mmask16)((1u << k) - 1u), p);"
                       "\n#endif")
        masked_store = ("#if defined(__AVX512F__)\n  _mm512_mask_storeu_ps(p, (__mmask16)"
                        "((1u << n) - 1u), (__m512)v);\n  return;\n#endif")
    elif lanes == 8:
        masked_load = ("#if defined(__AVX__)\n  return (pt_vf)_mm256_maskload_ps(p, "
                       "(__m256i)(pt_viota() < (int32_t)(n > 8 ? 8 : n)));\n#endif")
        # No vmaskmovps store: microcoded on Zen (~15 plain stores' time on Zen 3); the
        # lanes go out as a half, a quarter and a lane, by plain stores.
        masked_store = ("#if defined(__AVX__)\n  __m128 h = _mm256_castps256_ps128((__m256)v);\n"
                        "  if (n & 4) {\n    _mm_storeu_ps(p, h);\n    p += 4;\n"
                        "    h = _mm256_extractf128_ps((__m256)v, 1);\n  }\n"
                        "  if (n & 2) {\n    _mm_storel_pi((__m64 *)p, h);\n    p += 2;\n"
                        "    h = _mm_movehl_ps(h, h);\n  }\n"
                        "  if (n & 1) _mm_store_ss(p, h);\n  return;\n#endif")
    scaled_exp = _SCALED_EXP + "\n" if lanes == 16 else ""
    stream = _streaming(lanes) if streams else ""
    fold = " ".join(_halve("v", lanes, width, "v = v op h;") for width in _halvings(lanes))
    fold_max = " ".join(_halve("v", lanes, w, "v = pt_vmax_nan(v, h);") for w in _halvings(lanes))
    fold_min = " ".join(_halve("v", lanes, w, "v = pt_vmin_nan(v, h);") for w in _halvings(lanes))
    return f"""
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
typedef float pt_vf __attribute__((vector_size({nbytes})));
typedef int32_t pt_vi __attribute__((vector_size({nbytes})));
typedef float pt_vf_u __attribute__((vector_size({nbytes}), aligned(4)));
static inline pt_vf pt_vsel(pt_vi m, pt_vf a, pt_vf b) {{
  return (pt_vf)(((pt_vi)a & m) | ((pt_vi)b & ~m));
}}
static inline pt_vf pt_vsplat(float x) {{ return (pt_vf){{{splat}}}; }}
static inline pt_vi pt_viota(void) {{
  pt_vi v;
  for (int l = 0; l < {lanes}; l++) v[l] = l;
  return v;
}}
/* First n lanes from p, the rest 0; never touches memory past p[n-1]. A masked load
   costs about a plain one and is taken whatever n (a test of n in a reduction loop's
   loads cost more: shift conv 16.9 -> 18.8 ms on Zen 3). A masked store is microcoded on
   AMD's Zen (about 15 plain stores' time on Zen 3): a store of every lane or none takes a
   plain move or none, a partial one plain stores of 4, 2 and 1 lanes. */
static inline pt_vf pt_vload_n(const float *p, int64_t n) {{
{masked_load}
  if (n >= {lanes}) return *(const pt_vf_u *)p;
  pt_vf v = {{0}};
  for (int64_t l = 0; l < n; l++) v[l] = p[l];
  return v;
}}
static inline void pt_vstore_n(float *p, pt_vf v, int64_t n) {{
  if (n >= {lanes}) {{
    *(pt_vf_u *)p = v;
    return;
  }}
  if (n <= 0) return;
{masked_store}
  for (int64_t l = 0; l < n; l++) p[l] = v[l];
}}
static inline pt_vf pt_vload(const float *p) {{ return *(const pt_vf_u *)p; }}
/* A value kept in a vector register, not re-read from memory at each use. */
#if defined(__x86_64__) || defined(__i386__)
#define PT_HOLD(v) __asm__("" : "+v"(v))
#elif defined(__aarch64__)
#define PT_HOLD(v) __asm__("" : "+w"(v))
#else
#define PT_HOLD(v) ((void)0)
#endif
static inline void pt_vstore(float *p, pt_vf v) {{ *(pt_vf_u *)p = v; }}
{stream}/* Horizontal reductions by halving: log2(lanes) shuffles instead of a serial chain. */
#define PT_FOLD(v, op) do {{ {fold} }} while (0)
static inline float pt_vhsum(pt_vf v) {{
  PT_FOLD(v, +);
  return v[0];
}}
static inline float pt_vhprod(pt_vf v) {{
  PT_FOLD(v, *);
  return v[0];
}}
static inline pt_vf pt_vmax_nan(pt_vf a, pt_vf b) {{   /* NaN-propagating, like NumPy's max */
  pt_vi keep_a = (a > b) | (a != a);
  return pt_vsel(keep_a, a, b);
}}
static inline pt_vf pt_vmin_nan(pt_vf a, pt_vf b) {{
  pt_vi keep_a = (a < b) | (a != a);
  return pt_vsel(keep_a, a, b);
}}
static inline float pt_vhmax(pt_vf v) {{
  {fold_max}
  return v[0];
}}
static inline float pt_vhmin(pt_vf v) {{
  {fold_min}
  return v[0];
}}
static inline pt_vf pt_vfmax(pt_vf a, pt_vf b) {{      /* C fmaxf: a NaN operand loses */
  return pt_vsel((a > b) | (b != b), a, b);
}}
static inline pt_vf pt_vfmin(pt_vf a, pt_vf b) {{
  return pt_vsel((a < b) | (b != b), a, b);
}}
/* e^x = 2^n p: n = x / ln2 rounded (an integer in a float), p = e^r for r = x - n ln2
   (|r| <= ln2/2, ln2 in two parts), a degree-7 Taylor polynomial. */
static inline pt_vf pt_vexp_reduced(pt_vf x, pt_vf *n_out) {{
  pt_vf magic = pt_vsplat(12582912.0f);
  pt_vf n = (x * 1.4426950408889634f + magic) - magic;
  pt_vf r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  pt_vf p = pt_vsplat(1.9841270e-4f);
  p = p * r + 1.3888889e-3f;
  p = p * r + 8.3333333e-3f;
  p = p * r + 4.1666667e-2f;
  p = p * r + 1.6666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  *n_out = n;
  return p * r + 1.0f;
}}
static inline pt_vf pt_vexp(pt_vf x) {{
{scaled_exp}  const pt_vf hi = pt_vsplat(88.72283935546875f), lo = pt_vsplat(-87.33654022216797f);
  pt_vi over = x > hi, under = x < lo;
  pt_vf n, p = pt_vexp_reduced(pt_vsel(over, hi, pt_vsel(under, lo, x)), &n);
  /* 2^n p by adding n to p's exponent field: p = e^r lies in [2^-1/2, 2^1/2], so at
     the top of the range (n = 128, r < 0) p < 1 and the sum stays finite, where a
     factor 2^n would not exist; at the bottom (n = -126, r >= 0) p >= 1. */
  pt_vf y = (pt_vf)((pt_vi)p + (__builtin_convertvector(n, pt_vi) << 23));
  y = pt_vsel(over, pt_vsplat(__builtin_inff()), y);
  return pt_vsel(under, pt_vsplat(0.0f), y);
}}
static inline pt_vf pt_vlog(pt_vf x) {{
  /* a subnormal x is read as x 2^23, a normal float, with 23 taken off its exponent */
  pt_vi sub = (x > 0.0f) & (x < 1.17549435e-38f);
  pt_vi bits = (pt_vi)pt_vsel(sub, x * 8388608.0f, x);
  pt_vi e = ((bits >> 23) & 0xff) - 127 - (sub & 23);
  pt_vf m = (pt_vf)((bits & 0x007fffff) | 0x3f800000);
  pt_vi big = m > 1.41421356f;
  m = pt_vsel(big, m * 0.5f, m);
  e = e + (big & 1);
  pt_vf f = m - 1.0f;
  pt_vf z = f * f;
  pt_vf p = pt_vsplat(7.0376836292e-2f);
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  pt_vf y = f * z * p;
  pt_vf ef = __builtin_convertvector(e, pt_vf);
  y = y - 0.5f * z + f;
  y = y + ef * 0.693147180559945f;
  y = pt_vsel(x == 0.0f, pt_vsplat(-__builtin_inff()), y);
  y = pt_vsel(x < 0.0f, pt_vsplat(__builtin_nanf("")), y);
  y = pt_vsel(x == __builtin_inff(), x, y);
  return pt_vsel(x != x, x, y);
}}
static inline pt_vf pt_vtanh(pt_vf x) {{
  pt_vi neg = x < 0.0f;
  pt_vf a = pt_vsel(neg, -x, x);
  pt_vf z = x * x;
  pt_vf p = pt_vsplat(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  pt_vf small = x + x * z * p;
  pt_vf big = 1.0f - 2.0f / (pt_vexp(a + a) + 1.0f);
  big = pt_vsel(neg, -big, big);
  return pt_vsel(a < 0.625f, small, big);
}}
static inline pt_vf pt_verf(pt_vf x) {{
  pt_vi above = x >= 3.92f, below = x <= -3.92f;
  pt_vf c = pt_vsel(above, pt_vsplat(3.92f), pt_vsel(below, pt_vsplat(-3.92f), x));
  pt_vf t = c * c;
  pt_vf p = pt_vsplat(1.9977662e-08f);
  p = p * t - 1.9935765e-06f;
  p = p * t + 0.00014825651f;
  p = p * t + 0.0039393012f;
  p = p * t + 0.05128964f;
  p = p * t + 0.20530519f;
  p = p * t + 1.1283787f;
  pt_vf q = pt_vsplat(0.0010162271f);
  q = q * t + 0.014820306f;
  q = q * t + 0.117229715f;
  q = q * t + 0.5152759f;
  q = q * t + 1.0f;
  pt_vf y = c * p / q;
  y = pt_vsel(above, pt_vsplat(1.0f), pt_vsel(below, pt_vsplat(-1.0f), y));
  return pt_vsel(x != x, x, y);
}}
static inline pt_vf pt_vsigmoid(pt_vf x) {{ return 1.0f / (1.0f + pt_vexp(-x)); }}
"""


def _streaming(lanes: int) -> str:
    """pt_vstream and pt_sfence (C text, after pt_vstore)."""
    return f"""/* A store past the caches (non-temporal: no read of the line first) where the address
   is aligned for a whole vector, else a plain store: a view's rows may start anywhere.
   Streaming 16-byte halves where only those are aligned (NumPy's arrays start 16 bytes
   into a line) was 5-10% slower than plain stores on one thread (Zen 3 EPYC). */
static inline void pt_vstream(float *p, pt_vf v) {{
{_stream_store(lanes)}
  *(pt_vf_u *)p = v;
}}
/* Streaming stores before it are done before any store after it (visible to others). */
static inline void pt_sfence(void) {{
#if defined(__AVX__) || defined(__AVX512F__)
  _mm_sfence();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}}
"""


# exp on AVX-512: 2^n p by vscalefps, which gives inf above the range, so that the
# result needs no selects: 15 vector operations, 22 in the portable version below (two
# compares, four selects, a convert, a shift and an add). x is clamped above only so that
# n stays finite (vminps passes a NaN in its second operand on); below 2^-126 the result
# is 0, as the portable version's: a subnormal result, correctly rounded by vscalefps,
# made erf 5x slower (arithmetic on subnormals takes microcode assists on Intel cores).
# Timed: the module docstring.
_SCALED_EXP = """#if defined(__AVX512F__)
  {
    __mmask16 normal = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.33654022216797f),
                                          _CMP_NLT_UQ);
    pt_vf n, p = pt_vexp_reduced((pt_vf)_mm512_min_ps(_mm512_set1_ps(89.0f), (__m512)x), &n);
    return (pt_vf)_mm512_maskz_scalef_ps(normal, (__m512)p, (__m512)n);
  }
#endif"""


def _stream_store(lanes: int) -> str:
    """The body of pt_vstream before its plain-store fallback: a streaming store of the
    whole vector when the address is aligned for it."""
    if lanes == 16:
        return ("#if defined(__AVX512F__)\n"
                "  if (((uintptr_t)p & 63) == 0) {\n    _mm512_stream_ps(p, (__m512)v);\n"
                "    return;\n  }\n#endif")
    if lanes == 8:
        return ("#if defined(__AVX__)\n"
                "  if (((uintptr_t)p & 31) == 0) {\n    _mm256_stream_ps(p, (__m256)v);\n"
                "    return;\n  }\n#endif")
    return ""


def _halvings(lanes: int) -> list[int]:
    widths, w = [], lanes // 2
    while w >= 1:
        widths.append(w)
        w //= 2
    return widths


def _halve(v: str, lanes: int, width: int, combine: str) -> str:
    """Bring lanes [width, 2*width) down onto [0, width) and combine (upper lanes: don't care)."""
    order = ", ".join(str((k + width) % lanes if k < width else k) for k in range(lanes))
    return f"{{ pt_vf h = __builtin_shufflevector({v}, {v}, {order}); {combine} }}"
