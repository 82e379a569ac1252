"""CUDA through the PyPI packages of the `gpu` extra: NVRTC (`nvidia-cuda-nvrtc`, called
through `cuda-bindings`) compiles CUDA C++ to a CUBIN for one architecture on any host,
GPU or not; the driver API (`cuda-bindings`, over the NVIDIA driver's libcuda) loads and
launches it where a device exists.

    nvrtc_problem()              None, or why NVRTC cannot be used here (in words)
    compile_cubin(source, opts)  -> (CUBIN bytes, NVRTC's log); a BuildError quoting the
                                    generated lines NVRTC complains about
    device_problem("sm_90")      None, or why no device here runs an sm_90 CUBIN
    cuda_device()                the device (found once per process), else UnsupportedError
    load_module(device, cubin)   the CUBIN loaded into the device's primary context

A CUBIN for sm_XY runs on devices of compute capability X.Z with Z >= Y (the same major
version); that is the check `device_problem` makes.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from collections.abc import Callable
from typing import Any, TypeVar

from polytile.errors import BuildError, KernelError, UnsupportedError

_ARCH = re.compile(r"sm_(\d+)(\d)")
_LOG_LINE = re.compile(r"^(?P<file>[^()\s]+)\((?P<line>\d+)\): (?P<what>(?:catastrophic )?error)")
_QUOTED = 5
T = TypeVar("T")


def _nvrtc() -> Any:
    from cuda.bindings import nvrtc  # type: ignore[import-untyped]
    return nvrtc


@lru_cache(maxsize=1)
def nvrtc_problem() -> str | None:
    """None when NVRTC compiles here, else what is missing."""
    try:
        nvrtc = _nvrtc()
        err, _, _ = nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001 (ImportError, or the library failing to load)
        return f"NVRTC (cuda-bindings and nvidia-cuda-nvrtc: {e}; pip install 'polytile[gpu]')"
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return f"a working NVRTC (nvrtcVersion says {err.name})"
    return None


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """NVRTC's version, "13.5": part of every CUDA kernel's cache key."""
    _, major, minor = _nvrtc().nvrtcVersion()
    return f"{major}.{minor}"


def compile_cubin(source: str, options: tuple[str, ...], name: str = "kernel.cu"
                  ) -> tuple[bytes, str]:
    """`source` compiled by NVRTC with `options` (`--gpu-architecture=sm_90` makes a
    CUBIN): the CUBIN and NVRTC's log (warnings). A failure is a BuildError that quotes
    each error with the generated line it points at."""
    def cubin(nvrtc: Any, program: Any, log: str) -> tuple[bytes, str]:
        err, size = nvrtc.nvrtcGetCUBINSize(program)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size == 0:
            raise BuildError("NVRTC made no CUBIN (is the architecture a real one, e.g. "
                             f"sm_90, not compute_90?): options {' '.join(options)}",
                             source, log)
        binary = b" " * size
        nvrtc.nvrtcGetCUBIN(program, binary)
        return binary, log
    return _compile(source, options, name, cubin)


def compile_ptx(source: str, options: tuple[str, ...], name: str = "kernel.cu") -> str:
    """`source` compiled by NVRTC to PTX, for a virtual architecture
    (`--gpu-architecture=compute_90`): what the CUBIN's instructions come from, as text
    (e.g. to see that a kernel uses `mma.sync`). Failures as in `compile_cubin`."""
    def ptx(nvrtc: Any, program: Any, log: str) -> str:
        _, size = nvrtc.nvrtcGetPTXSize(program)
        text = b" " * size
        nvrtc.nvrtcGetPTX(program, text)
        return text.rstrip(b"\x00 ").decode()
    return _compile(source, options, name, ptx)


def _compile(source: str, options: tuple[str, ...], name: str,
             take: Callable[[Any, Any, str], T]) -> T:
    """Compile `source` with NVRTC and `take` what is wanted from the program (given
    NVRTC, the program and its log); the program is destroyed afterwards."""
    problem = nvrtc_problem()
    if problem:
        raise UnsupportedError(f"compiling CUDA needs {problem}",
                               hint="`polytile show --stage cuda` prints the source without it")
    nvrtc = _nvrtc()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != ok:
        raise BuildError(f"NVRTC could not take the generated source ({err.name})", source)
    try:
        encoded = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        err, size = nvrtc.nvrtcGetProgramLogSize(program)
        log_bytes = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log_bytes)
        log = log_bytes.rstrip(b"\x00 ").decode(errors="replace").strip()
        if result != ok:
            raise BuildError(_failure_message(result.name, log, source), source, log,
                             hint="the whole source is in BuildError.source_code and NVRTC's "
                                  "log in BuildError.compiler_output; `polytile show FILE.tc "
                                  "--stage cuda --target cuda-sm90 --sizes ...` prints it")
        return take(nvrtc, program, log)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _failure_message(status: str, log: str, source: str) -> str:
    """NVRTC's errors, each followed by the generated line it names."""
    lines = source.splitlines()
    quoted: list[str] = []
    errors = [m for m in map(_LOG_LINE.match, log.splitlines()) if m]
    for m in errors[:_QUOTED]:
        number = int(m.group("line"))
        text = m.string
        quoted.append(f"  {text}")
        if 1 <= number <= len(lines):
            quoted.append(f"    {number} | {lines[number - 1].strip()}")
    if len(errors) > _QUOTED:
        quoted.append(f"  ... and {len(errors) - _QUOTED} more")
    if not quoted:
        quoted = [f"  {line}" for line in log.splitlines()[:_QUOTED]]
    return f"NVRTC failed ({status}) on generated CUDA code" + (
        ":\n" + "\n".join(quoted) if quoted else "")


def arch_version(arch: str) -> tuple[int, int]:
    """`sm_90` -> (9, 0)."""
    m = _ARCH.fullmatch(arch)
    if m is None:
        raise UnsupportedError(f"{arch!r} is not a CUDA architecture like sm_90")
    return int(m.group(1)), int(m.group(2))


# ---------------------------------------------------------------- the driver API


@dataclass(frozen=True)
class Device:
    """A CUDA device and its primary context (made current on each thread that uses it)."""

    driver: Any                     # cuda.bindings.driver
    device: Any
    context: Any
    name: str
    capability: tuple[int, int]
    max_grid: tuple[int, int, int]

    def make_current(self) -> None:
        check(self.driver, self.driver.cuCtxSetCurrent(self.context))

    @property
    def ordinal(self) -> int:
        """The device's number, as in `cuda:0`."""
        return int(self.device)


def check(driver: Any, result: Any) -> Any:
    """The values of a driver call's result tuple; a CUDA error is a KernelError."""
    result = result if isinstance(result, tuple) else (result,)
    err, values = result[0], result[1:]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorString(err)
        said = text.decode() if isinstance(text, bytes) else str(text)
        raise KernelError(f"the CUDA driver failed: {err.name} ({said})")
    return values[0] if len(values) == 1 else values


_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _find_device() -> Device | str:
    try:
        from cuda.bindings import driver  # type: ignore[import-untyped]
    except ImportError as e:
        return f"no CUDA device (cuda-bindings: {e}; pip install 'polytile[gpu]')"
    try:
        (err,) = driver.cuInit(0)
    except Exception as e:  # noqa: BLE001 (no libcuda: cuda-bindings raises its own)
        return f"no CUDA device (the NVIDIA driver's libcuda cannot be loaded: {type(e).__name__})"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"no CUDA device (cuInit: {err.name})"
    try:
        count = check(driver, driver.cuDeviceGetCount())
        if count == 0:
            return "no CUDA device (the driver sees none)"
        device = check(driver, driver.cuDeviceGet(0))
        attr = driver.CUdevice_attribute
        major, minor, gx, gy, gz = (
            check(driver, driver.cuDeviceGetAttribute(a, device)) for a in (
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
                attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
                attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z))
        name = check(driver, driver.cuDeviceGetName(256, device))
        context = check(driver, driver.cuDevicePrimaryCtxRetain(device))
    except KernelError as e:
        return f"no usable CUDA device ({e.message})"
    text = name.split(b"\x00")[0].decode() if isinstance(name, bytes) else str(name)
    return Device(driver, device, context, text, (major, minor), (gx, gy, gz))


def device_problem(arch: str | None = None) -> str | None:
    """None when this host has a CUDA device (that runs `arch` CUBINs, if given), else
    why not, in words."""
    with _LOCK:
        found = _find_device()
    if isinstance(found, str):
        return found
    if arch is not None:
        want = arch_version(arch)
        if found.capability[0] != want[0] or found.capability[1] < want[1]:
            have = ".".join(map(str, found.capability))
            return (f"a CUDA device of compute capability {want[0]}.{want[1]} or a later "
                    f"{want[0]}.x (this host's {found.name} is {have})")
    return None


def cuda_device() -> Device:
    """The device kernels run on; UnsupportedError saying what is missing."""
    with _LOCK:
        found = _find_device()
    if isinstance(found, str):
        raise UnsupportedError(
            f"cannot run a CUDA kernel: {found}",
            hint="a cuda target's kernels compile on any host (the CUBIN is built and cached); `polytile show FILE.tc --stage "
                 "cuda --target cuda-sm90 --sizes ...` prints the source; to run on this "
                 "host use target opencl (PoCL) or a cpu target")
    return found


def load_module(device: Device, cubin: bytes) -> Any:
    """A CUBIN loaded into the device's context; a CUBIN for another architecture is an
    UnsupportedError naming both."""
    driver = device.driver
    device.make_current()
    result = driver.cuModuleLoadData(cubin)
    if result[0] == driver.CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU:
        have = ".".join(map(str, device.capability))
        raise UnsupportedError(f"this kernel's CUBIN is not for {device.name} (compute "
                               f"capability {have})",
                               hint="use the cuda target of the device's architecture, e.g. "
                                    "cuda-sm80 for 8.x devices")
    return check(driver, result)
