"""CUDA and the GPUs: torch's CUDA build against the CUDA version the NVIDIA driver supports
(``cuDriverGetVersion`` from ``libcuda.so.1``, else a table of minimum driver versions), checked in
the parent before anything is imported; then what the check process saw — the CUDA probe and
initialisation, a matmul on each visible GPU, torch's kernels for its architecture — and free GPU
memory against ``--need-gpu-memory``."""

from __future__ import annotations

from lora_otel.cli.doctor.child import MATMUL_N
from lora_otel.cli.doctor.report import Check, _secs, format_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the check process imports every module here, and not typing
    from typing import Any

    from lora_otel.cli.doctor.follow import _Run


# --- CUDA build against the driver ------------------------------------------------------------


# CUDA toolkit → minimum Linux driver (NVIDIA's CUDA release notes, "CUDA Toolkit and Corresponding
# Driver Versions", GA releases). Used only when libcuda cannot be asked (cuDriverGetVersion).
_CUDA_MIN_DRIVER: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((13, 0), (580, 65, 6)),
    ((12, 9), (575, 51, 3)),
    ((12, 8), (570, 26)),
    ((12, 6), (560, 28, 3)),
    ((12, 5), (555, 42, 2)),
    ((12, 4), (550, 54, 14)),
    ((12, 3), (545, 23, 6)),
    ((12, 2), (535, 54, 3)),
    ((12, 1), (530, 30, 2)),
    ((12, 0), (525, 60, 13)),
    ((11, 8), (520, 61, 5)),
    ((11, 7), (515, 43, 4)),
    ((11, 6), (510, 39, 1)),
    ((11, 5), (495, 29, 5)),
    ((11, 4), (470, 42, 1)),
    ((11, 3), (465, 19, 1)),
    ((11, 2), (460, 27, 3)),
    ((11, 1), (455, 23)),
    ((11, 0), (450, 36, 6)),
    ((10, 2), (440, 33)),
    ((10, 1), (418, 39)),
    ((10, 0), (410, 48)),
)
# CUDA major → the driver from which every minor of it runs through minor version compatibility.
_MINOR_COMPAT_DRIVER = {13: (580,), 12: (525, 60, 13), 11: (450, 80, 2)}


def _vtuple(text: str | None) -> tuple[int, ...]:
    out = []
    for part in str(text or "").strip().split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def max_cuda_for_driver(driver: str) -> tuple[int, ...] | None:
    """``(major, minor)`` of the newest CUDA the table says ``driver`` supports, or None (too old or
    unparsable). A driver newer than the table's newest entry gets that entry."""
    d = _vtuple(driver)
    if not d:
        return None
    for cuda, minimum in _CUDA_MIN_DRIVER:
        if d >= minimum:
            return cuda
    return None


def driver_cuda_version(timeout_s: float = 5.0) -> str | None:
    """The CUDA version the installed driver supports (``cuDriverGetVersion``, as nvidia-smi's
    "CUDA Version"), e.g. ``"12.4"``; None when libcuda cannot be loaded or does not answer in time.
    Does not initialise CUDA. Runs in a thread, so a driver that hangs cannot hang the doctor."""
    result: dict[str, str] = {}

    def ask() -> None:
        try:
            import ctypes

            lib = ctypes.CDLL("libcuda.so.1")
            v = ctypes.c_int(0)
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value > 0:
                result["v"] = "%d.%d" % (v.value // 1000, (v.value % 1000) // 10)
        except Exception:  # noqa: BLE001 - no libcuda here
            pass

    import threading

    t = threading.Thread(target=ask, name="lora-otel-doctor-libcuda", daemon=True)
    t.start()
    t.join(timeout_s)
    return result.get("v")


def check_cuda_build(
    build: dict[str, Any], driver: dict[str, Any], driver_cuda: str | None, probe: dict[str, Any] | None = None
) -> Check | None:
    """torch's CUDA build against the driver. ``build``: ``envfacts.torch_build()``; ``driver``:
    ``envfacts.driver_facts()``; ``driver_cuda``: `driver_cuda_version`; ``probe``: what the check
    process saw (``available``, ``reason``), when it got that far. None when torch is not installed."""
    tv = build.get("torch.version")
    if not tv:
        return None
    cuda = build.get("torch.cuda_build")
    hip = build.get("torch.hip_build")
    drv = driver.get("nvidia.driver_version")
    gpus = driver.get("nvidia.gpu_count")
    gpus_text = "" if not isinstance(gpus, int) else " (%d GPU%s)" % (gpus, "" if gpus == 1 else "s")
    details = {
        "torch": tv,
        "torch_cuda_build": cuda,
        "torch_hip_build": hip,
        "driver": drv,
        "driver_cuda": driver_cuda,
        "gpu_count": gpus,
        "probe": probe,
    }
    no_driver = "no NVIDIA driver (/proc/driver/nvidia/version missing)"
    if hip:
        return Check(
            "cuda",
            "warn",
            "torch %s is a ROCm/HIP %s build; the NVIDIA CUDA checks do not apply" % (tv, hip),
            None,
            details=details,
        )
    if not cuda:
        if drv:
            return Check(
                "cuda",
                "fail",
                "torch %s is a CPU build, but NVIDIA driver %s is here%s" % (tv, drv, gpus_text),
                "install a CUDA build of torch (https://pytorch.org/get-started/locally/), built for a "
                "CUDA version the driver supports%s" % (" (up to %s)" % driver_cuda if driver_cuda else ""),
                details=details,
            )
        return Check(
            "cuda",
            "warn",
            "no CUDA: CPU build of torch (%s); %s" % (tv, no_driver),
            "training runs on the CPU here; to train on a GPU, use a machine with an NVIDIA GPU "
            "and a CUDA build of torch",
            details=details,
        )
    if not drv:
        return Check(
            "cuda",
            "warn",
            "torch %s is built for CUDA %s, but there is %s" % (tv, cuda, no_driver),
            "run on a GPU machine; in a container, start it with the NVIDIA runtime (docker --gpus all)",
            details=details,
        )
    want = _vtuple(cuda)[:2]
    source = "libcuda"
    have = _vtuple(driver_cuda)[:2] if driver_cuda else None
    if not have:
        have = max_cuda_for_driver(drv)
        source = "table"
        if have is None:
            return Check(
                "cuda",
                "warn",
                "torch %s is built for CUDA %s; cannot tell which CUDA driver %s supports" % (tv, cuda, drv),
                "compare with the CUDA version nvidia-smi shows",
                details=details,
            )
    newest_known = _CUDA_MIN_DRIVER[0][0]
    have_text = "%d.%d" % have + ("+" if source == "table" and have == newest_known else "")
    details["driver_cuda"] = have_text
    head = "torch %s built for CUDA %s; driver %s%s supports CUDA %s" % (tv, cuda, drv, gpus_text, have_text)
    if have >= want or (source == "table" and have == newest_known):
        return Check("cuda", "ok", head, details=details)
    compat = _MINOR_COMPAT_DRIVER.get(want[0])
    if have[0] == want[0] and compat and _vtuple(drv) >= compat:
        need = dict(_CUDA_MIN_DRIVER).get(want)
        return Check(
            "cuda",
            "warn",
            head + ": runs only through CUDA minor version compatibility (no PTX JIT; some kernels may fail)",
            "upgrade the NVIDIA driver%s, or install torch built for CUDA %s"
            % (" to %s or newer" % ".".join(map(str, need)) if need else "", have_text),
            details=details,
        )
    return Check(
        "cuda",
        "fail",
        head + ": too old for this torch, CUDA will not initialise",
        "upgrade the NVIDIA driver, or install torch built for CUDA %s or older "
        "(https://pytorch.org/get-started/previous-versions/)" % have_text,
        details=details,
    )


# --- what the check process saw -----------------------------------------------------------------


def _gpu_check(name: str, msg: dict[str, Any]) -> Check:
    i = msg.get("index")
    dt = msg.get("duration_s")
    head = "%s (sm_%s)" % (msg.get("device_name") or "GPU %s" % i, str(msg.get("capability", "?")).replace(".", ""))
    mem = ""
    if isinstance(msg.get("free"), int) and isinstance(msg.get("total"), int):
        mem = "; %s free of %s" % (format_bytes(msg["free"]), format_bytes(msg["total"]))
    details = {
        k: msg.get(k)
        for k in (
            "index",
            "device_name",
            "capability",
            "free",
            "total",
            "matmul_s",
            "max_rel_error",
            "arch_list",
            "arch_ok",
        )
    }
    if msg.get("status") != "ok":
        return Check(
            name,
            "fail",
            "%s: %s%s" % (head, msg.get("error"), mem),
            "the GPU cannot run torch's kernels: check nvidia-smi and dmesg (Xid errors); for 'no kernel "
            "image', install a torch build for this GPU's architecture",
            duration_s=dt,
            details=details,
        )
    text = "%s: %dx%d matmul and read back in %s, max relative error %.1g%s" % (
        head,
        MATMUL_N,
        MATMUL_N,
        _secs(msg.get("matmul_s") or 0),
        msg.get("max_rel_error") or 0.0,
        mem,
    )
    if msg.get("arch_ok") is False:
        return Check(
            name,
            "warn",
            text
            + "; torch has no kernels built for sm_%s (built: %s)"
            % (str(msg.get("capability")).replace(".", ""), " ".join(msg.get("arch_list") or [])),
            "install a torch build that lists this GPU's architecture (torch.cuda.get_arch_list())",
            duration_s=dt,
            details=details,
        )
    return Check(name, "ok", text, duration_s=dt, details=details)


def _cuda_runtime_checks(run: _Run, static: Check | None, need: int | None) -> list[Check]:
    """The ``cuda`` line (static build vs driver, with what the probe saw), ``cuda init``, the GPUs,
    ``gpu memory``."""
    out: list[Check] = []
    probe = run.results.get("cuda probe")
    cuda = static
    if cuda is not None and probe is not None:
        cuda.details["probe"] = {k: probe.get(k) for k in ("available", "reason")}
        if probe.get("status") == "ok" and not probe.get("available") and cuda.status == "ok":
            cuda = Check(
                "cuda",
                "fail",
                cuda.evidence
                + "; but torch.cuda.is_available() is False: %s" % (probe.get("reason") or "no reason given"),
                "check CUDA_VISIBLE_DEVICES and that this process can open /dev/nvidia*",
                details=cuda.details,
            )
        elif probe.get("status") != "ok":
            cuda = Check(
                "cuda",
                "fail",
                "torch.cuda.is_available() raised %s" % probe.get("error"),
                "reinstall torch",
                details=cuda.details,
            )
        cuda.duration_s = probe.get("duration_s")
    if cuda is not None:
        out.append(cuda)
    init = run.results.get("cuda init")
    if init is not None:
        if init.get("status") == "ok":
            names = init.get("device_names") or []
            out.append(
                Check(
                    "cuda init",
                    "ok",
                    "%d device%s: %s in %s"
                    % (
                        len(names),
                        "" if len(names) == 1 else "s",
                        ", ".join(names),
                        _secs(init.get("duration_s") or 0),
                    ),
                    duration_s=init.get("duration_s"),
                    details={"device_names": names},
                )
            )
        else:
            out.append(
                Check(
                    "cuda init",
                    "fail",
                    "raised %s" % init.get("error"),
                    "check nvidia-smi, the driver (dmesg: Xid errors) and that torch's CUDA build fits "
                    "the driver (the cuda line)",
                    duration_s=init.get("duration_s"),
                    details={"traceback": init.get("traceback")},
                )
            )
    gpus = [(n, m) for n, m in run.results.items() if n.startswith("gpu ") and n[4:].isdigit()]
    gpus.sort(key=lambda nm: int(nm[0][4:]))
    for name, msg in gpus:
        out.append(_gpu_check(name, msg))
    if need is not None:
        out.append(_memory_check(need, probe, init, gpus, static))
    return out


def _memory_check(
    need: int,
    probe: dict[str, Any] | None,
    init: dict[str, Any] | None,
    gpus: list[tuple[str, dict[str, Any]]],
    static: Check | None,
) -> Check:
    want = "need %s free GPU memory" % format_bytes(need)
    measured = [(n, m) for n, m in gpus if isinstance(m.get("free"), int)]
    if measured:
        short = [(n, m) for n, m in measured if m["free"] < need]
        details = {"need": need, "free": {n: m["free"] for n, m in measured}}
        if short:
            return Check(
                "gpu memory",
                "fail",
                "%s; %s"
                % (
                    want,
                    ", ".join(
                        "%s has %s free of %s" % (n, format_bytes(m["free"]), format_bytes(m.get("total") or 0))
                        for n, m in short
                    ),
                ),
                "free the GPUs (nvidia-smi shows who holds them), use GPUs with more memory, or lower the job's "
                "memory (batch size, gradient checkpointing, 4-bit base weights)",
                details=details,
            )
        low = min(measured, key=lambda nm: nm[1]["free"])
        return Check(
            "gpu memory",
            "ok",
            "%s; every visible GPU has it (the least: %s with %s free)" % (want, low[0], format_bytes(low[1]["free"])),
            details=details,
        )
    reason = None
    if probe is not None and probe.get("status") == "ok" and not probe.get("available"):
        reason = "torch sees no CUDA device (%s)" % (probe.get("reason") or "torch.cuda.is_available() is False")
    elif (
        probe is None
        and static is not None
        and (not static.details.get("torch_cuda_build") or not static.details.get("driver"))
    ):
        reason = "torch can use none here (%s)" % (
            static.evidence[len("no CUDA: ") :] if static.evidence.startswith("no CUDA: ") else static.evidence
        )
    if reason:
        return Check(
            "gpu memory",
            "fail",
            "no GPU: %s, but %s" % (want, reason),
            "run on a machine with a GPU that has %s free" % format_bytes(need),
            details={"need": need},
        )
    return Check(
        "gpu memory",
        "warn",
        "%s; not measured: CUDA did not get that far" % want,
        "fix the CUDA lines above first",
        details={"need": need},
    )
