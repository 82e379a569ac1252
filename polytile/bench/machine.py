"""Facts about the machine and the libraries a bench result depends on.

    facts = machine_facts()
    print("\\n".join(f"{k}: {v}" for k, v in facts.items()))

Everything is read, nothing assumed: /proc/cpuinfo and sysfs for the CPU, the probed C
compiler, threadpoolctl (when installed) for which BLAS kernel NumPy actually runs, and
the load average, since another process on a 2-core machine changes every number.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

# Features that matter to the kernels polytile generates, in the order they are printed.
_FEATURES = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
             "neon", "asimd")
BLAS_ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def machine_facts() -> dict[str, str]:
    from polytile.bench.peak import usable_cores
    from polytile.targets.target import host_features

    features = host_features()
    return {
        "CPU": _cpu_model(),
        "cores": f"{usable_cores()} usable ({os.cpu_count()} online)",
        "features": " ".join(f for f in _FEATURES if f in features) or "(none of interest)",
        "caches": _caches(),
        "memory": _memory(),
        "OS": f"{platform.system()} {platform.release()} {platform.machine()}",
        "Python": platform.python_version(),
        "C compiler": _compiler(),
        "polytile target": _target(),
        "NumPy": _numpy(),
        "PyTorch": _torch(),
        "load average": _load(),
    }


def load_average() -> str:
    return _load()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _caches() -> str:
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    parts = []
    for index in sorted(base.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction":
            parts.append(f"L{level} {size}")
    return ", ".join(parts) or "unknown"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def _compiler() -> str:
    try:
        from polytile.config import load_config
        from polytile.runtime.toolchain import detect_toolchain
        return detect_toolchain(load_config()).version
    except Exception as e:  # noqa: BLE001 - a fact we cannot read is reported, not fatal
        return f"unavailable ({e})"


def _target() -> str:
    try:
        from polytile.config import load_config
        from polytile.targets.target import select_target
        return select_target(load_config().target).identity
    except Exception as e:  # noqa: BLE001
        return f"unavailable ({e})"


def _numpy() -> str:
    import numpy as np
    text = np.__version__
    try:
        from threadpoolctl import threadpool_info  # type: ignore[import-untyped]
    except ImportError:
        return text + ", BLAS kernel unknown (install threadpoolctl to see it)"
    blas = [f"{i.get('internal_api')} {i.get('version')} kernel {i.get('architecture')}, "
            f"{i.get('num_threads')} threads ({_library(i.get('filepath'))})"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    overrides = [f"{v}={os.environ[v]}" for v in BLAS_ENV_VARS if v in os.environ]
    if overrides:
        blas.append("with " + " ".join(overrides))
    return text + (", " + "; ".join(blas) if blas else "")


def _library(path: object) -> str:
    """site-packages/numpy.libs/libscipy_openblas64_-....so -> numpy.libs/libscipy_openblas64_"""
    if not isinstance(path, str):
        return "?"
    p = Path(path)
    return f"{p.parent.name}/{p.name.split('-')[0]}"


def _torch() -> str:
    try:
        import torch
    except ImportError:
        return "not installed (torch columns show n/a)"
    return f"{torch.__version__}, {torch.get_num_threads()} threads"


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3]) + " (1, 5, 15 min)"
    except OSError:
        return "unknown"
