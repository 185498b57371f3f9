"""Free GPU memory from NVML through ``ctypes`` (no context is created on the device).

Loaded only inside the ``cuda init`` span, after torch has initialised CUDA. Returns None
wherever NVML is missing or refuses; never raises.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    import ctypes

_nvml: ctypes.CDLL | None = None
_nvml_failed = False


def _lib() -> ctypes.CDLL | None:
    global _nvml, _nvml_failed
    if _nvml is not None or _nvml_failed:
        return _nvml
    try:
        import ctypes

        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        _nvml = lib
    except Exception:  # noqa: BLE001 - no NVML here
        _nvml_failed = True
    return _nvml


def free_memory(uuid: str | None, index: int) -> int | None:
    """Free memory in bytes of the device with this UUID (torch's), else NVML index ``index``."""
    lib = _lib()
    if lib is None:
        return None
    try:
        import ctypes

        class _Mem(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        handle = ctypes.c_void_p()
        rc = 1
        if uuid:
            u = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
            rc = lib.nvmlDeviceGetHandleByUUID(u.encode(), ctypes.byref(handle))
        if rc != 0:
            rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
        if rc != 0:
            return None
        mem = _Mem()
        if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0:
            return None
        return int(mem.free)
    except Exception:  # noqa: BLE001
        return None
