"""Error bounds of the vector math (polytile/codegen/vmath.py), measured against
float64 NumPy/SciPy on dense samples and special values."""
import ctypes
import subprocess

import numpy as np
import pytest
from scipy import special

from polytile.codegen.vmath import vector_math
from polytile.targets.target import host_features

LANES = 16
FUNCS = ("exp", "log", "tanh", "erf", "sigmoid")


# The host's own instructions, and on an AVX-512 host the portable code too: the first
# then runs exp through vscalefps, the second through the exponent-field add.
FLAGS = {"native": ["-march=native"]}
if "avx512f" in host_features():
    FLAGS["portable"] = ["-march=native", "-mno-avx512f"]


@pytest.fixture(scope="module", params=sorted(FLAGS))
def vmath_lib(request, tmp_path_factory):
    body = "\n".join(
        f"void run_{f}(const float *x, float *y, long n) {{\n"
        f"  for (long i = 0; i + {LANES} <= n; i += {LANES}) pt_vstore(y + i, pt_v{f}(pt_vload(x + i)));\n"
        f"}}" for f in FUNCS)
    src = "#include <stdint.h>\n#include <math.h>\n" + vector_math(LANES) + body
    d = tmp_path_factory.mktemp("vmath")
    (d / "v.c").write_text(src)
    subprocess.run(["cc", "-O2", *FLAGS[request.param], "-shared", "-fPIC", str(d / "v.c"),
                    "-o", str(d / "v.so"), "-lm"], check=True)
    return ctypes.CDLL(str(d / "v.so"))


def _run(lib, name, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    getattr(lib, f"run_{name}")(x.ctypes.data_as(ctypes.c_void_p),
                                 y.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(x.size))
    return y


def _samples(lo, hi, n=1 << 16):
    return np.linspace(lo, hi, n, dtype=np.float32)


def _ulp_error(got, want):
    want32 = want.astype(np.float32)
    spacing = np.spacing(np.abs(want32)).astype(np.float64)
    return np.max(np.abs(got.astype(np.float64) - want) / spacing)


def test_exp_within_2_ulp(vmath_lib):
    x = _samples(-87.0, 88.0)
    assert _ulp_error(_run(vmath_lib, "exp", x), np.exp(x.astype(np.float64))) <= 2.0


def test_exp_finite_up_to_the_largest_float(vmath_lib):
    # exp(x) for x in [127.5 ln 2, ln FLT_MAX] is finite (2.4e38 to 3.4e38): a factor
    # 2^128 of the range reduction would make it inf.
    top = np.float32(np.log(np.finfo(np.float32).max))
    x = np.linspace(88.0, top, LANES * 512, dtype=np.float32)
    x = x[: x.size // LANES * LANES]
    want = np.exp(x.astype(np.float64))
    got = _run(vmath_lib, "exp", x)
    finite = want < np.finfo(np.float32).max
    assert np.isfinite(got[finite]).all()
    assert _ulp_error(got[finite], want[finite]) <= 2.0


def test_exp_below_the_normal_range_is_0(vmath_lib):
    """Results under 2^-126 flush to 0 on both paths (a subnormal result would make the
    arithmetic after it take microcode assists); the smallest normal result is kept."""
    x = np.linspace(-110.0, -87.34, LANES * 256, dtype=np.float32)
    assert (_run(vmath_lib, "exp", x) == 0).all()
    edge = np.full(LANES, -87.3365, np.float32)
    got = _run(vmath_lib, "exp", edge)
    assert _ulp_error(got, np.exp(edge.astype(np.float64))) <= 2.0


def test_log_within_3_ulp(vmath_lib):
    x = np.exp(_samples(-80.0, 80.0)).astype(np.float32)
    assert _ulp_error(_run(vmath_lib, "log", x), np.log(x.astype(np.float64))) <= 3.0


def test_log_of_subnormals(vmath_lib):
    # Below 2^-126 the exponent field is 0: read as it is, log(1e-40) came out -88.0,
    # not -92.1.
    x = np.geomspace(1.4e-45, 1.2e-38, LANES * 64).astype(np.float32)
    x = x[x > 0]
    x = x[: x.size // LANES * LANES]
    assert _ulp_error(_run(vmath_lib, "log", x), np.log(x.astype(np.float64))) <= 3.0


def test_tanh_erf_absolute_error(vmath_lib):
    x = _samples(-10.0, 10.0)
    x64 = x.astype(np.float64)
    assert np.max(np.abs(_run(vmath_lib, "tanh", x) - np.tanh(x64))) <= 2e-7
    assert np.max(np.abs(_run(vmath_lib, "erf", x) - special.erf(x64))) <= 3.5e-7


def test_erf_relative_error_near_zero(vmath_lib):
    x = np.geomspace(1e-30, 1e-2, LANES * 4096).astype(np.float32)
    x = np.concatenate([x, -x])
    want = special.erf(x.astype(np.float64))
    assert np.max(np.abs(_run(vmath_lib, "erf", x) / want - 1)) <= 1e-6


def test_sigmoid_relative_error(vmath_lib):
    x = _samples(-30.0, 30.0)
    want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    assert _ulp_error(_run(vmath_lib, "sigmoid", x), want) <= 3.0


def test_special_values(vmath_lib):
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 100.0, -100.0,
                         1.0, -1.0, 0.5, 2.0, 88.8, -88.0, 3.0], dtype=np.float32)
    with np.errstate(all="ignore"):
        exp = _run(vmath_lib, "exp", specials)
        np.testing.assert_array_equal(np.isnan(exp), np.isnan(specials))
        assert exp[1] == np.inf and exp[2] == 0.0 and exp[13] == np.inf
        log = _run(vmath_lib, "log", np.abs(specials))
        assert np.isnan(log[0]) and log[1] == np.inf and log[3] == -np.inf
        assert np.isnan(_run(vmath_lib, "log", np.full(16, -1.0, np.float32))).all()
        tanh = _run(vmath_lib, "tanh", specials)
        assert np.isnan(tanh[0]) and tanh[1] == 1.0 and tanh[2] == -1.0
        erf = _run(vmath_lib, "erf", specials)
        assert np.isnan(erf[0]) and erf[1] == 1.0 and erf[2] == -1.0
