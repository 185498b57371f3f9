"""The training stack's own steps, judged from what the check process said: each ``import NAME``
(with advice that tells a missing package from a broken one, and an error raised inside another
package's failed import from its own), and the LoRA forward and backward."""

from __future__ import annotations

from lora_otel.cli.doctor.report import Check, _frame_text, _secs

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the check process imports every module here, and not typing
    from collections.abc import Iterable
    from typing import Any


STACK = ("torch", "transformers", "diffusers", "accelerate", "peft", "bitsandbytes", "xformers")
"""The training stack, in import order (a package after the ones it imports, so each span is its own)."""


def _import_advice(module: str, msg: dict[str, Any]) -> str:
    etype = msg.get("error_type") or ""
    missing = msg.get("missing") or ""
    top = module.partition(".")[0]
    if etype == "ModuleNotFoundError" and missing:
        if missing.partition(".")[0] == top:
            return "not installed: pip install %s (or fix PYTHONPATH)" % top
        return "%s needs %s, which is missing: install the package that provides it" % (module, missing)
    return "reinstall %s (pip install --force-reinstall %s), or install a version that fits the rest of the stack" % (
        top,
        top,
    )


def _import_check(name: str, msg: dict[str, Any], failed_before: Iterable[str] = ()) -> Check:
    """An import's line. ``failed_before``: modules whose import failed earlier; an error raised
    inside one of them is that module's, and the advice says so."""
    module = name[len("import ") :]
    dt = msg.get("duration_s")
    if msg.get("status") == "ok":
        version = msg.get("version")
        return Check(
            name,
            "ok",
            "%s in %s" % (version or "(no version)", _secs(dt or 0)),
            duration_s=dt,
            details={"version": version, "file": msg.get("file")},
        )
    frames = msg.get("frames") or []
    where = ""
    if frames:
        import linecache

        p, n, f = frames[-1]
        where = " at %s" % _frame_text(p, n, f, linecache.getline(p, n).strip())
    advice = _import_advice(module, msg)
    top = module.partition(".")[0]
    for other in failed_before:
        other_top = other.partition(".")[0]
        paths = [p for p, _, _ in frames] + list(msg.get("chained_files") or [])
        if other_top != top and any(
            "/%s/" % other_top in p.replace("\\", "/") or p.replace("\\", "/").endswith("/%s.py" % other_top)
            for p in paths
        ):
            advice = "raised inside %s, whose own import failed above: fix %s first" % (other_top, other_top)
            break
    return Check(
        name,
        "fail",
        "raised %s%s" % (msg.get("error"), where),
        advice,
        duration_s=dt,
        details={"error": msg.get("error"), "traceback": msg.get("traceback"), "frames": frames},
    )


def _lora_check(msg: dict[str, Any]) -> Check:
    dt = msg.get("duration_s")
    details = {
        k: msg.get(k)
        for k in ("model", "device", "loss", "lora_tensors", "lora_tensors_with_grad", "trainable", "total", "peft")
    }
    if msg.get("status") != "ok":
        frames = msg.get("frames") or []
        where = " at %s" % _frame_text(*frames[-1]) if frames else ""
        details["traceback"] = msg.get("traceback")
        return Check(
            "lora",
            "fail",
            "LoRA forward/backward on a tiny %s (%s) failed: %s%s"
            % (msg.get("model") or "model", msg.get("device") or "?", msg.get("error"), where),
            "peft, transformers and torch do not work together here: compare their versions with peft's "
            "requirements (above), or upgrade peft",
            duration_s=dt,
            details=details,
        )
    return Check(
        "lora",
        "ok",
        "peft %s: LoRA r=4 forward+backward on a tiny %s (%s) in %s, loss %.3g, "
        "%d of %d LoRA tensors got gradients, base weights frozen"
        % (
            msg.get("peft") or "?",
            msg.get("model"),
            msg.get("device"),
            _secs(msg.get("compute_s") or 0),
            msg.get("loss") or 0.0,
            msg.get("lora_tensors_with_grad") or 0,
            msg.get("lora_tensors") or 0,
        ),
        duration_s=dt,
        details=details,
    )
