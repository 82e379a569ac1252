import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import polytile as pt
from conformance.test_conformance import assert_agrees
from .test_properties import contractions, chains

S = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

def _run(source, shapes, target):
    c = pt.define(source, target=target)
    r = pt.define(source, backend="interp")
    name = c.program.functions[0].name
    fn = c.program.functions[0]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(shapes[p.name]).astype(np.float32) for p in fn.params]
    got = c[name](*args); want = r[name](*args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert_agrees(g, w, 1e-5, source + str(shapes) + str(target))

@S
@given(program=contractions(), target=st.sampled_from([None, "cpu-avx2", "cpu-generic"]))
def test_c_contractions(program, target):
    _run(*program, target)

@S
@given(program=chains(), target=st.sampled_from([None, "cpu-avx2", "cpu-generic"]))
def test_c_chains(program, target):
    _run(*program, target)
