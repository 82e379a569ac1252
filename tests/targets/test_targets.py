"""Targets on any host: `polytile targets` lists them, `polytile show --target` prints
code for a machine this host is not (running it stays refused)."""
from __future__ import annotations

from pathlib import Path

import pytest

from polytile import cli
from polytile.errors import ArgumentError
from polytile.targets import target as T

AVX2_HOST = frozenset({"avx", "avx2", "fma", "sse4_2"})
MM = """def mm(float(M,K) A, float(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
}
"""


@pytest.fixture
def avx2_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(T, "host_features", lambda: AVX2_HOST)
    monkeypatch.setattr(T.platform, "machine", lambda: "x86_64")


def test_every_shipped_target_is_listed_with_its_backend(avx2_host: None,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["targets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {t.name for t in T.shipped_targets()} >= {"cpu-avx512", "cpu-avx2",
                                                                  "cpu-generic"}
    assert all(f" {t.backend} " in rows[t.name] for t in T.shipped_targets())
    assert "no (lacks avx512f, avx512bw, avx512dq, avx512vl)" in rows["cpu-avx512"]
    assert rows["cpu-avx2"].rstrip().endswith("yes")
    assert rows["cpu-generic"].rstrip().endswith("yes")


def test_running_a_target_the_host_lacks_is_refused(avx2_host: None) -> None:
    with pytest.raises(ArgumentError, match="needs avx512f, avx512bw, avx512dq, avx512vl"):
        T.select_target("cpu-avx512")


@pytest.mark.parametrize("stage", ["ir", "loops", "c"])
def test_show_prints_avx512_code_on_an_avx2_host(avx2_host: None, stage: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "mm.tc"
    source.write_text(MM)
    assert cli.main(["show", str(source), "--stage", stage, "--sizes", "M=48,K=40,N=56",
                     "--target", "cpu-avx512"]) == 0
    out, err = capsys.readouterr()
    assert "this host lacks avx512f" in err and "cannot run here" in err
    # 512-bit float32 vectors, chosen for cpu-avx512
    wide = {"ir": "float32, 16)", "loops": "float32x16", "c": "vector_size(64)"}
    narrow = {"ir": "float32, 4)", "loops": "float32x4", "c": "vector_size(16)"}
    assert wide[stage] in out
    assert cli.main(["show", str(source), "--stage", stage, "--sizes", "M=48,K=40,N=56",
                     "--target", "cpu-generic"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert narrow[stage] in out    # 128-bit


def test_inspection_target_on_a_host_that_runs_it_uses_the_host_features() -> None:
    generic = T.inspection_target("cpu-generic", frozenset({"sse2"}))
    assert generic.features == frozenset({"sse2"})
    avx512 = T.inspection_target("cpu-avx512", AVX2_HOST)
    assert avx512.features >= {"avx512f", "avx512_vnni", "amx_int8"}


def test_unknown_target_lists_the_shipped_ones() -> None:
    with pytest.raises(ArgumentError, match="unknown target"):
        T.inspection_target("gpu-imaginary")


def test_a_target_uses_only_the_host_features_it_declares() -> None:
    """On an AVX-512 VNNI host, cpu-avx2 runs AVX2 code: the host's avx512_vnni is not a
    feature of that target (it took vpdpbusd on zmm registers, found on a Xeon), while its
    own optional avx_vnni is used where the host has it."""
    xeon = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                      "avx512_vnni"})
    avx2 = T.select_target("cpu-avx2", xeon)
    assert avx2.has("avx2") and not avx2.has("avx512_vnni") and not avx2.has("avx512bw")
    assert T.select_target("cpu-avx2", xeon | {"avx_vnni"}).has("avx_vnni")
    assert T.select_target("cpu-avx512", xeon).has("avx512_vnni")
    assert not T.select_target("cpu-generic", xeon).has("avx2")
