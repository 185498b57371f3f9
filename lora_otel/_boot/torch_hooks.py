"""torch hooks: optimizer steps open ``training`` and count, CUDA initialisation becomes a span.

Loaded by :mod:`lora_otel._boot.hooks` the moment the program has imported torch (a process that
never does never loads this module). :func:`install` puts in:

- a global optimizer step hook (``torch.optim``'s ``register_optimizer_step_pre_hook``/
  ``post_hook``) that counts steps and opens ``training`` at the first one (and, with
  ``LORA_OTEL_STEP_SPANS=N``, a ``step K`` span every N steps);
- ``torch.cuda._lazy_init`` wrapped into the ``cuda init`` span, and the first
  ``torch.cuda.is_available()`` into a ``cuda probe`` span, each saying why CUDA is absent when
  it is.

Like every hook, each wrapper runs its bookkeeping inside :class:`~lora_otel._boot.core.fail_open`
and calls the original exactly once.
"""

from __future__ import annotations

import os
import sys

from lora_otel._boot import core, stages

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import in the process
    from types import ModuleType
    from typing import Any


def _step_spans_every() -> int:
    """``LORA_OTEL_STEP_SPANS=N``: one ``step K`` span every N optimizer steps (default 0: none)."""
    text = os.environ.get("LORA_OTEL_STEP_SPANS", "").strip()
    if not text:
        return 0
    if text.isdigit():
        return int(text)
    core.error_line("LORA_OTEL_STEP_SPANS=%r is not a whole number; no step spans" % text)
    return 0


_step_every = -1  # read on the first step
_step_span: str | None = None


def on_step_pre(*_args: object) -> None:
    """torch's global optimizer step pre-hook: opens ``training`` at the first step."""
    global _step_every, _step_span
    if core.forked_at:
        core.settle()  # (the parent's training is none of a forked child's)
    if stages.training_id is None or stages.training_id not in core.open_spans:
        with core.fail_open("optimizer step hook"):
            stages.ensure_training("optimizer step", "first optimizer step")
    if _step_every:  # -1: not read yet; 0: no step spans (the default)
        if _step_every < 0:
            _step_every = _step_spans_every()
            if not _step_every:
                return
        if core.steps % _step_every:
            return
        with core.fail_open("step span"):
            _step_span = core.span_start(
                "step %d" % (core.steps + 1),
                {"lora_otel.step": core.steps + 1},
                parent_id=stages.training_id,
                push=False,
            )


def on_step_post(*_args: object) -> None:
    """torch's global optimizer step post-hook: counts the step."""
    global _step_span
    core.steps += 1
    core.last_step_ns = core.now_ns()
    if _step_span is not None:
        with core.fail_open("step span"):
            core.span_end(_step_span)
        _step_span = None


def install(torch: ModuleType) -> None:
    """Install the optimizer step hooks and the CUDA hooks on ``torch`` (once per process: the
    import hook calls this the first time torch is loaded)."""
    # Said on the root span, which every reader keeps (ended import spans may be dropped by a live
    # tail): a process that imported torch idling with no stage open may be a stuck job.
    core.span_attrs(core.root_id, {"lora_otel.torch.imported": True})
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    except ImportError:
        core.error_line(
            "this torch (%s) has no global optimizer step hooks; use lora_otel.progress()"
            % getattr(torch, "__version__", "?")
        )
    else:
        register_optimizer_step_pre_hook(on_step_pre)
        register_optimizer_step_post_hook(on_step_post)
    _install_cuda_hooks(torch)


def _cuda_absent_reason(torch: ModuleType) -> str:
    from lora_otel._boot import envfacts

    if getattr(torch.version, "cuda", None) is None:
        if getattr(torch.version, "hip", None):
            return "ROCm build of torch (%s); no NVIDIA CUDA" % torch.__version__
        return "CPU build of torch (%s)" % torch.__version__
    if not envfacts.driver_facts().get("lora_otel.nvidia.driver_version") and not os.path.exists("/dev/nvidiactl"):
        return "no NVIDIA driver (/proc/driver/nvidia/version missing)"
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "none", "NoDevFiles"):
        return "no visible device (CUDA_VISIBLE_DEVICES=%r)" % cvd
    return "no visible device"


def _cuda_facts(torch: ModuleType) -> dict[str, Any]:
    from lora_otel._boot import envfacts, gpu

    attrs: dict[str, Any] = {
        "lora_otel.torch.version": str(torch.__version__),
        "lora_otel.cuda.version": str(torch.version.cuda),
    }
    with core.fail_open("cuda facts"):
        v = torch.backends.cudnn.version()
        if v:
            attrs["lora_otel.cudnn.version"] = str(v)
    drv = envfacts.driver_facts().get("lora_otel.nvidia.driver_version")
    if drv:
        attrs["lora_otel.nvidia.driver_version"] = drv
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    attrs["lora_otel.cuda.visible_devices"] = cvd if cvd is not None else "(unset)"
    n = torch.cuda.device_count()
    attrs["lora_otel.cuda.device_count"] = n
    names: list[str] = []
    caps: list[str] = []
    totals: list[int] = []
    frees: list[int] = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        names.append(str(p.name))
        caps.append("%d.%d" % (p.major, p.minor))
        totals.append(int(p.total_memory))
        uuid = getattr(p, "uuid", None)
        free = gpu.free_memory(str(uuid) if uuid is not None else None, i)
        frees.append(-1 if free is None else int(free))
    attrs["lora_otel.cuda.device_names"] = names
    attrs["lora_otel.cuda.capabilities"] = caps
    attrs["lora_otel.cuda.total_memory_bytes"] = totals
    attrs["lora_otel.cuda.free_memory_bytes"] = frees
    return attrs


def _install_cuda_hooks(torch: ModuleType) -> None:
    tc = torch.cuda
    orig_init = getattr(tc, "_lazy_init", None)
    if orig_init is not None and not getattr(orig_init, "_lora_otel", False):
        state = {"done": False}

        def _lazy_init() -> object:
            if state["done"]:
                return orig_init()
            try:
                initialized = tc.is_initialized()
            except Exception:  # noqa: BLE001
                initialized = False
            if initialized:
                state["done"] = True
                return orig_init()
            sid = None
            with core.fail_open("cuda init hook"):
                core.promote("cuda init")
                sid = core.span_start(
                    "cuda init", {"lora_otel.cuda.visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")}
                )
                core.info_line("cuda init: starting")
            try:
                result = orig_init()
            except BaseException as e:
                state["done"] = True
                if sid is not None:
                    with core.fail_open("cuda init hook"):
                        reason = _cuda_absent_reason(torch)
                        core.span_end(
                            sid,
                            "error",
                            "%s: %s" % (type(e).__name__, e),
                            {
                                "lora_otel.cuda.available": False,
                                "lora_otel.cuda.absent_reason": reason,
                                "lora_otel.torch.version": str(torch.__version__),
                            },
                        )
                        core.error_line("cuda init failed: %s: %s (%s)" % (type(e).__name__, e, reason))
                raise
            state["done"] = True
            if sid is not None:
                with core.fail_open("cuda init hook"):
                    facts = _cuda_facts(torch)
                    facts["lora_otel.cuda.available"] = True
                    core.span_end(sid, "ok", attrs=facts)
                    core.info_line(
                        "cuda init: done, %d device(s): %s"
                        % (facts["lora_otel.cuda.device_count"], ", ".join(facts["lora_otel.cuda.device_names"]))
                    )
            return result

        _lazy_init._lora_otel = True  # type: ignore[attr-defined]
        _lazy_init.__wrapped__ = orig_init  # type: ignore[attr-defined]
        # Modules that did ``from torch.cuda import _lazy_init`` hold their own reference.
        for modname, mod in list(sys.modules.items()):
            if (modname == "torch.cuda" or modname.startswith("torch.cuda.")) and getattr(
                mod, "_lazy_init", None
            ) is orig_init:
                mod._lazy_init = _lazy_init  # type: ignore[attr-defined]  # torch.cuda's own attribute

    orig_avail = getattr(tc, "is_available", None)
    if orig_avail is not None and not getattr(orig_avail, "_lora_otel", False):
        probed = {"done": False}

        def is_available() -> object:
            if probed["done"]:
                return orig_avail()
            probed["done"] = True
            sid = None
            with core.fail_open("cuda probe hook"):
                sid = core.span_start("cuda probe", {})
            try:
                result = orig_avail()
            except BaseException as e:
                if sid is not None:
                    with core.fail_open("cuda probe hook"):
                        core.span_end(sid, "error", "%s: %s" % (type(e).__name__, e))
                raise
            if sid is not None:
                with core.fail_open("cuda probe hook"):
                    attrs: dict[str, object] = {
                        "lora_otel.cuda.available": bool(result),
                        "lora_otel.torch.version": str(torch.__version__),
                    }
                    if not result:
                        attrs["lora_otel.cuda.absent_reason"] = _cuda_absent_reason(torch)
                        core.info_line("CUDA not available: %s" % attrs["lora_otel.cuda.absent_reason"])
                    core.span_end(sid, "ok", attrs=attrs)
            return result

        is_available._lora_otel = True  # type: ignore[attr-defined]
        is_available.__wrapped__ = orig_avail  # type: ignore[attr-defined]
        tc.is_available = is_available
