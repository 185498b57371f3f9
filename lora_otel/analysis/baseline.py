"""Baselines: what a good run's environment and start-up looked like, and the drift from it.

A baseline file (JSON, docs/baselines.md; `make_baseline`, `write_baseline`, `load_baseline`) holds
the environment (of an interpreter, from the same self-check the training process runs at start,
``lora_otel._boot.envfacts``; or the one recorded in a journal's root span) and, from the journals
of good runs, the median duration of each start-up phase.

The drift (`compare`, `compare_journal`) of a journal, of another baseline, or of an interpreter
from a baseline: packages added, removed or of another version; Python; torch's CUDA/ROCm build,
cuDNN, the NVIDIA driver; the GPUs; the relevant environment variables (values as the self-check
recorded them, already redacted); and the phases much slower than in the baseline: more than
``SLOWER_FACTOR`` (2) times and more than ``SLOWER_BY_S`` (1 s) longer, e.g. ``import torch took
48 s; baseline 2.1 s``.

With ``LORA_OTEL_BASELINE`` naming a baseline file, ``lora-otel inspect`` and the live stall
diagnosis put first the drift that bears on the stage the process is stuck in (`split`), e.g. for
``import bitsandbytes`` a new bitsandbytes, another torch or CUDA build; for ``cuda init`` the
driver, the GPUs, ``CUDA_*`` variables.

Start-up phases, per journal: ``arguments``, every ``import X``, ``cuda probe``, ``cuda init``
(at any depth) and the user stages directly under ``process`` that start before ``training``
(durations of one name added up), and ``start-up``: from the process's start to the start of
``training``.

The ``lora-otel baseline save|diff`` command and the lines ``inspect`` prints are
`lora_otel.cli.baseline`'s. Standard library only (plus lora_otel's own reader and self-check).

One module (over 600 lines) because the file, the drift and the relevance rules are one model: the
file carries exactly the facts the drift compares, and `split` ranks the drift kinds and keys
that `diff_environment` and `diff_phases` produce.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from lora_otel._boot.seam import duration
from lora_otel.analysis.stall import median
from lora_otel.journal.reader import Journal, Span, process_state

FORMAT = "lora-otel baseline"
VERSION = 1
"""The baseline file format version this module writes and reads."""
ENV_VARIABLE = "LORA_OTEL_BASELINE"
SLOWER_FACTOR = 2.0
SLOWER_BY_S = 1.0
"""A phase is much slower than the baseline when it took more than SLOWER_FACTOR times the
baseline's median and more than SLOWER_BY_S seconds longer."""
STARTUP = "start-up"
"""The phase from the process's start to the start of ``training``."""

VOLATILE_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_PORT",
        "SLURM_JOB_ID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_ERROR_FILE",
    }
)
"""Variables that name the run or the process, not the environment: never counted as drift."""

MAX_FILE_BYTES = 16 << 20
_NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"
_VALUE_MAX = 60

# (key, label, None means "unknown" rather than "none") of the scalar facts, in report order.
_SCALARS = (
    ("python", "Python", True),
    ("python_executable", "Python executable", True),
    ("os", "OS", True),
    ("kernel", "kernel", True),
    ("arch", "arch", True),
    ("torch_cuda", "torch CUDA build", False),
    ("torch_hip", "torch ROCm/HIP build", False),
    ("cudnn", "cuDNN", False),
    ("driver", "NVIDIA driver", False),
    ("gpu_count", "GPUs", False),
    ("gpu_models", "GPU models", True),
)
_NONE_TEXT = {
    "torch_cuda": "none (CPU build)",
    "torch_hip": "none",
    "cudnn": "none found",
    "driver": "none found",
    "gpu_count": "none",
}


class BaselineError(Exception):
    """A baseline file or a journal that cannot be used; the message is one line."""


# --- the environment -------------------------------------------------------------------------


def environment_from_attrs(attrs: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The environment recorded by the self-check (``envfacts.collect``'s attributes), or None when
    ``attrs`` hold no self-check (a process that ended before it ran)."""
    if "process.runtime.version" not in attrs and "process.runtime.name" not in attrs:
        return None

    def text(key: str) -> Optional[str]:
        value = attrs.get(key)
        return value if isinstance(value, str) and value else None

    count = attrs.get("lora_otel.nvidia.gpu_count")
    return {
        "python": text("process.runtime.version"),
        "python_executable": text("lora_otel.python.executable"),
        "os": text("os.type"),
        "kernel": text("os.version"),
        "arch": text("host.arch"),
        "packages": {
            key[len("lora_otel.pkg.") :]: str(value)
            for key, value in attrs.items()
            if key.startswith("lora_otel.pkg.") and value not in (None, "")
        },
        "torch_cuda": text("lora_otel.torch.cuda_build"),
        "torch_hip": text("lora_otel.torch.hip_build"),
        "cudnn": text("lora_otel.cudnn.version"),
        "driver": text("lora_otel.nvidia.driver_version"),
        "gpu_count": count if isinstance(count, int) and not isinstance(count, bool) else None,
        "gpu_models": None,
        "env": {
            key[len("lora_otel.env.") :]: str(value)
            for key, value in sorted(attrs.items())
            if key.startswith("lora_otel.env.")
        },
    }


def driver_gpu_models(directory: str = _NVIDIA_GPUS_DIR) -> Optional[list[str]]:
    """The distinct GPU models the NVIDIA driver lists (``Model:`` of each
    ``/proc/driver/nvidia/gpus/*/information``), sorted; None when it lists none."""
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return None
    models = set()
    for entry in entries:
        try:
            with open(os.path.join(directory, entry, "information"), "rb") as f:
                head = f.read(8192).decode("utf-8", "replace")
        except OSError:
            continue
        for line in head.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == "Model" and value.strip():
                models.add(value.strip())
                break
    return sorted(models) or None


def interpreter_environment() -> dict[str, Any]:
    """This interpreter's environment, by the self-check a traced process runs at start (the same
    redaction of the variables), plus the GPU models the driver lists."""
    from lora_otel._boot.seam import envfacts, redact

    env = environment_from_attrs(envfacts.collect(os.environ, redact.redact_env)) or {}
    env["gpu_models"] = driver_gpu_models()
    return env


def journal_environment(journal: Journal) -> Optional[dict[str, Any]]:
    """The environment a journal's self-check recorded (None without one), with the GPU models its
    ``cuda init`` saw."""
    if journal.root is None:
        return None
    env = environment_from_attrs(journal.root.attrs)
    if env is None:
        return None
    for span in journal.spans:
        names = span.attrs.get("lora_otel.cuda.device_names") if span.name == "cuda init" else None
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            env["gpu_models"] = sorted(set(names))
            break
    return env


# --- phases ----------------------------------------------------------------------------------


def _training(journal: Journal) -> Optional[Span]:
    return min((s for s in journal.spans if s.name == "training"), key=lambda s: s.start_ns, default=None)


def _is_phase(span: Span, root: Span) -> bool:
    name = span.name
    if name in ("arguments", "cuda probe", "cuda init") or name.startswith("import "):
        return True
    return span.parent_id == root.span_id and name != "training" and not name.startswith("step ")


def reference_ns(journal: Journal, now_ns: Optional[int] = None) -> int:
    """The time open spans are open *until*: now while the process runs, else its last evidence."""
    if process_state(journal) == "running":
        return time.time_ns() if now_ns is None else now_ns
    return journal.last_evidence_ns or 0


def journal_phases(journal: Journal, until_ns: Optional[int] = None) -> dict[str, tuple[float, bool]]:
    """``{phase: (seconds, open)}`` of the journal's start-up phases, in start order.

    Without ``until_ns`` only ended phases count. With it, an open phase counts as lasting until
    ``until_ns`` (``open`` True), and so does ``start-up`` in a journal without ``training`` that
    has no exit record either.
    """
    root = journal.root
    if root is None:
        return {}
    training = _training(journal)
    cutoff = training.start_ns if training is not None else None
    out: dict[str, tuple[float, bool]] = {}
    for span in journal.spans:
        if span is root or (cutoff is not None and span.start_ns >= cutoff) or not _is_phase(span, root):
            continue
        if span.end_ns is not None:
            seconds, is_open = (span.end_ns - span.start_ns) / 1e9, False
        elif until_ns is not None:
            seconds, is_open = max(until_ns - span.start_ns, 0) / 1e9, True
        else:
            continue
        before, was_open = out.get(span.name, (0.0, False))
        out[span.name] = (before + seconds, was_open or is_open)
    if training is not None:
        out[STARTUP] = (max(training.start_ns - root.start_ns, 0) / 1e9, False)
    elif until_ns is not None and journal.exit is None:
        out[STARTUP] = (max(until_ns - root.start_ns, 0) / 1e9, True)
    return out


def median_phases(journals: Iterable[Journal]) -> dict[str, dict[str, Any]]:
    """``{phase: {"median_s", "runs"}}``: the median over the journals that have the phase."""
    seen: dict[str, list[float]] = {}
    for journal in journals:
        for name, (seconds, _) in journal_phases(journal).items():
            seen.setdefault(name, []).append(seconds)
    return {name: {"median_s": round(median(values), 3), "runs": len(values)} for name, values in seen.items()}


# --- the file --------------------------------------------------------------------------------


@dataclass
class Baseline:
    """A loaded baseline file."""

    path: str
    doc: dict[str, Any]

    @property
    def environment(self) -> Optional[dict[str, Any]]:
        return self.doc.get("environment")

    @property
    def phases(self) -> dict[str, float]:
        return {name: float(entry["median_s"]) for name, entry in (self.doc.get("phases") or {}).items()}

    def describe(self) -> str:
        """``saved 2026-11-29T22:13:48.123Z from this interpreter (/x/python), phases of 3 journals``."""
        source = self.doc.get("source") or {}
        parts = []
        if isinstance(self.doc.get("created_at"), str):
            parts.append("saved %s" % self.doc["created_at"])
        if source.get("environment") == "journal" and isinstance(source.get("journal"), str):
            parts.append("environment of %s" % source["journal"])
        elif isinstance(source.get("interpreter"), str):
            parts.append("environment of %s" % source["interpreter"])
        journals = source.get("journals")
        if isinstance(journals, list) and journals:
            parts.append("phases of %d journal%s" % (len(journals), "" if len(journals) == 1 else "s"))
        return ", ".join(parts)


def make_baseline(
    environment: Optional[dict[str, Any]], phases: dict[str, dict[str, Any]], source: dict[str, Any]
) -> dict[str, Any]:
    from lora_otel._version import __version__
    from lora_otel.journal.tree import iso_time

    return {
        "format": FORMAT,
        "version": VERSION,
        "created_at": iso_time(time.time_ns()),
        "lora_otel_version": __version__,
        "source": source,
        "environment": environment,
        "phases": phases,
    }


def write_baseline(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` whole or not at all (a temporary file renamed over it)."""
    if os.path.isdir(path):
        raise BaselineError("cannot write %s: is a directory" % path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise BaselineError("cannot write %s: %s" % (path, e.strerror or e)) from None


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise BaselineError("%s: no such file" % path) from None
    except IsADirectoryError:
        raise BaselineError("%s: is a directory, not a %s" % (path, what)) from None
    except PermissionError:
        raise BaselineError("%s: permission denied" % path) from None
    except OSError as e:
        raise BaselineError("%s: cannot read: %s" % (path, e.strerror or e)) from None
    if len(data) > MAX_FILE_BYTES:
        raise BaselineError("%s: not a baseline file (larger than %d MiB)" % (path, MAX_FILE_BYTES >> 20))
    return data.decode("utf-8", "replace")


def load_baseline(path: str) -> Baseline:
    """Read and check a baseline file. Raises `BaselineError` (one line) when it cannot be used."""
    text = _read_text(path, "baseline file")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise BaselineError("%s: not a baseline file (not JSON: %s)" % (path, str(e).splitlines()[0])) from None
    except RecursionError:
        raise BaselineError("%s: not a baseline file (not JSON: nested too deeply)" % path) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BaselineError('%s: not a baseline file (no "format": "%s")' % (path, FORMAT))
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BaselineError("%s: bad baseline version %r" % (path, version))
    if version > VERSION:
        raise BaselineError(
            "%s: baseline version %d is newer than this lora-otel reads (%d)" % (path, version, VERSION)
        )
    env = doc.get("environment")
    if env is not None:
        if not isinstance(env, dict):
            raise BaselineError("%s: 'environment' is not an object" % path)
        for key in ("packages", "env"):
            value = env.get(key)
            if value is not None and (
                not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
            ):
                raise BaselineError("%s: 'environment.%s' is not an object of strings" % (path, key))
        models = env.get("gpu_models")
        if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
            raise BaselineError("%s: 'environment.gpu_models' is not a list of strings" % path)
    phases = doc.get("phases")
    if phases is not None:
        if not isinstance(phases, dict):
            raise BaselineError("%s: 'phases' is not an object" % path)
        for name, entry in phases.items():
            seconds = entry.get("median_s") if isinstance(entry, dict) else None
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds >= 0:
                raise BaselineError("%s: phase %r has no 'median_s' number of seconds" % (path, name))
    return Baseline(path, doc)


def resolve_path(path: str, journal: Optional[Journal] = None) -> str:
    """``path``; a relative one that does not exist here is taken from the journal's process's
    working directory (the sidecar runs in ``/``)."""
    if os.path.isabs(path) or os.path.exists(path) or journal is None or journal.root is None:
        return path
    cwd = journal.root.attrs.get("process.working_directory")
    if isinstance(cwd, str) and os.path.isabs(cwd) and os.path.exists(os.path.join(cwd, path)):
        return os.path.join(cwd, path)
    return path


def configured(journal: Optional[Journal] = None, environ: Optional[Mapping[str, str]] = None) -> Optional[Baseline]:
    """The baseline ``LORA_OTEL_BASELINE`` names, or None when it is unset or empty.

    Raises `BaselineError` (one line) when the file cannot be used."""
    path = (os.environ if environ is None else environ).get(ENV_VARIABLE, "").strip()
    if not path:
        return None
    try:
        return load_baseline(resolve_path(path, journal))
    except BaselineError as e:
        raise BaselineError("%s=%s: %s" % (ENV_VARIABLE, path, e)) from None


# --- drift -----------------------------------------------------------------------------------


@dataclass
class Drift:
    """One difference from the baseline. ``kind``: ``package``, ``env``, ``phase``, or a scalar
    fact (``python``, ``torch_cuda``, ``cudnn``, ``driver``, ``gpu_count``, ``gpu_models``, ...);
    ``change``: ``added``, ``removed``, ``changed`` or ``slower``."""

    kind: str
    name: str
    change: str
    baseline: Any
    current: Any
    text: str
    open: bool = False  # a phase still open (stuck) in the journal

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "name": self.name,
            "change": self.change,
            "baseline": self.baseline,
            "current": self.current,
            "text": self.text,
        }
        if self.kind == "phase":
            out["open"] = self.open
        return out


@dataclass
class Comparison:
    drift: list[Drift] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _value(value: Any) -> str:
    if isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    text = str(value)
    if text == "":
        return '""'
    if len(text) > _VALUE_MAX:
        text = text[: _VALUE_MAX - 1] + "…"
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fact_text(key: str, value: Any) -> str:
    """A scalar fact as a drift line says it; None in the words of `_NONE_TEXT` (default ``none``)."""
    return _NONE_TEXT.get(key, "none") if value is None else _value(value)


def _package_order(name: str) -> tuple[int, str]:
    from lora_otel._boot.seam import PACKAGES

    return (PACKAGES.index(name), "") if name in PACKAGES else (len(PACKAGES), name)


def diff_environment(base: Optional[Mapping[str, Any]], current: Optional[Mapping[str, Any]]) -> list[Drift]:
    """The environment drift, in report order: packages, Python, OS, the torch build, cuDNN, the
    driver, the GPUs, then the variables. A fact unknown on either side is not compared."""
    if base is None or current is None:
        return []
    out: list[Drift] = []
    base_pkgs, cur_pkgs = base.get("packages"), current.get("packages")
    if isinstance(base_pkgs, dict) and isinstance(cur_pkgs, dict):
        for name in sorted(set(base_pkgs) | set(cur_pkgs), key=_package_order):
            was, now = base_pkgs.get(name), cur_pkgs.get(name)
            if was == now:
                continue
            if was is None:
                out.append(
                    Drift(
                        "package",
                        name,
                        "added",
                        None,
                        now,
                        "%s %s (not installed in the baseline)" % (name, _value(now)),
                    )
                )
            elif now is None:
                out.append(
                    Drift(
                        "package", name, "removed", was, None, "%s not installed (baseline: %s)" % (name, _value(was))
                    )
                )
            else:
                out.append(Drift("package", name, "changed", was, now, "%s %s → %s" % (name, _value(was), _value(now))))
    torch_on_both = (
        isinstance(base_pkgs, dict) and isinstance(cur_pkgs, dict) and "torch" in base_pkgs and "torch" in cur_pkgs
    )
    for key, label, none_is_unknown in _SCALARS:
        if key not in base or key not in current:
            continue  # an older or hand-edited file: unknown
        was, now = base[key], current[key]
        if was == now or (none_is_unknown and (was is None or now is None)):
            continue
        if key in ("torch_cuda", "torch_hip") and not torch_on_both:
            continue  # torch itself added or removed says it
        change = "added" if was is None else "removed" if now is None else "changed"
        text = "%s %s → %s" % (label, _fact_text(key, was), _fact_text(key, now))
        out.append(Drift(key, label, change, was, now, text))
    base_env, cur_env = base.get("env"), current.get("env")
    if isinstance(base_env, dict) and isinstance(cur_env, dict):
        for name in sorted(set(base_env) | set(cur_env)):
            if name in VOLATILE_ENV:
                continue
            was, now = base_env.get(name), cur_env.get(name)
            if was == now:
                continue
            if was is None:
                out.append(
                    Drift("env", name, "added", None, now, "%s=%s (not set in the baseline)" % (name, _value(now)))
                )
            elif now is None:
                out.append(Drift("env", name, "removed", was, None, "%s not set (baseline: %s)" % (name, _value(was))))
            else:
                out.append(Drift("env", name, "changed", was, now, "%s: %s → %s" % (name, _value(was), _value(now))))
    return out


def _seconds(s: float) -> str:
    return duration(s)


def diff_phases(
    base: Mapping[str, float],
    current: Mapping[str, tuple[float, bool]],
    factor: float = SLOWER_FACTOR,
    by_s: float = SLOWER_BY_S,
) -> list[Drift]:
    """The phases of ``current`` much slower than in ``base``: more than ``factor`` times and more
    than ``by_s`` seconds longer. An open phase counts with how long it has been open so far."""
    out = []
    for name, (seconds, is_open) in current.items():
        was = base.get(name)
        if was is None or not (seconds > factor * was and seconds - was > by_s):
            continue
        if not is_open:
            text = "%s took %s; baseline %s" % (name, _seconds(seconds), _seconds(was))
        elif name == STARTUP:
            text = "%s has taken %s without reaching training; baseline %s" % (name, _seconds(seconds), _seconds(was))
        else:
            text = "%s has taken %s and not finished; baseline %s" % (name, _seconds(seconds), _seconds(was))
        out.append(Drift("phase", name, "slower", round(was, 3), round(seconds, 3), text, is_open))
    return out


def compare(
    baseline: Baseline,
    environment: Optional[Mapping[str, Any]],
    phases: Optional[Mapping[str, tuple[float, bool]]] = None,
    what: str = "the journal",
    factor: float = SLOWER_FACTOR,
    by_s: float = SLOWER_BY_S,
) -> Comparison:
    """The drift of ``environment`` and ``phases`` (None: not compared) from ``baseline``."""
    result = Comparison()
    if baseline.environment is None:
        result.notes.append("the baseline has no environment")
    elif environment is None:
        result.notes.append(
            "%s has no environment self-check (the process ended before it ran); only the phases are compared" % what
        )
    result.drift += diff_environment(baseline.environment, environment)
    if phases:
        if not baseline.phases:
            result.notes.append("the baseline has no phases (it was saved without journals of good runs)")
        result.drift += diff_phases(baseline.phases, phases, factor, by_s)
    return result


def compare_journal(
    baseline: Baseline,
    journal: Journal,
    now_ns: Optional[int] = None,
    factor: float = SLOWER_FACTOR,
    by_s: float = SLOWER_BY_S,
) -> Comparison:
    """The drift of a journal (its environment, its phases with the open ones so far)."""
    return compare(
        baseline,
        journal_environment(journal),
        journal_phases(journal, reference_ns(journal, now_ns)),
        "the journal",
        factor,
        by_s,
    )


# --- what bears on a stage -------------------------------------------------------------------

_GPU_MODULES = frozenset(
    {
        "torch",
        "bitsandbytes",
        "xformers",
        "triton",
        "deepspeed",
        "flash_attn",
        "apex",
        "vllm",
        "unsloth",
        "torchvision",
        "torchaudio",
        "cupy",
        "nvidia",
        "auto_gptq",
        "awq",
        "liger_kernel",
    }
)
_HUB_MODULES = frozenset(
    {
        "transformers",
        "diffusers",
        "peft",
        "huggingface_hub",
        "accelerate",
        "tokenizers",
        "datasets",
        "safetensors",
        "trl",
        "sentence_transformers",
        "evaluate",
        "timm",
    }
)
_TORCH_USERS = _GPU_MODULES | _HUB_MODULES | {"lightning", "pytorch_lightning", "torchmetrics"}
_GPU_FACTS = ("torch_cuda", "torch_hip", "cudnn", "driver")
_IMPORT_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")
_GPU_ENV_PREFIXES = ("CUDA_", "NVIDIA_")
_HUB_ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_")
_TRAINING_ENV_PREFIXES = ("NCCL_", "TORCH_", "TORCHELASTIC_", "PYTORCH_", "CUDA_", "NVIDIA_", "ACCELERATE_")
_TRAINING_ENV = (
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "CUBLAS_WORKSPACE_CONFIG",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
)
_TRAINING_PACKAGES = (
    "torch",
    "accelerate",
    "deepspeed",
    "lightning",
    "pytorch_lightning",
    "transformers",
    "peft",
    "bitsandbytes",
    "xformers",
    "triton",
    "diffusers",
)
_CUDA_FACTS = ("torch_cuda", "torch_hip", "cudnn", "driver", "gpu_count", "gpu_models", "kernel")
_CUDA_ENV = (
    "LD_LIBRARY_PATH",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
)


def _norm(name: str) -> str:
    from lora_otel._boot.seam import normalize_package as _normalize

    return _normalize(name)


def _bears_on(d: Drift, stage: str, in_training: bool) -> int:
    """0: about the stage itself (its package, its own phase); 1: bears on it; 2: does not."""
    if d.kind == "phase":
        if d.name == stage:
            return 0
        return 1 if d.name == STARTUP and stage and not in_training and stage != "training" else 2
    if stage.startswith("import "):
        module = _norm(stage[len("import ") :].strip().partition(".")[0])
        if d.kind == "package" and _norm(d.name) == module:
            return 0
        if d.kind in ("python", "python_executable", "arch") or (d.kind == "env" and d.name in _IMPORT_ENV):
            return 1
        if module in _GPU_MODULES and (
            d.kind in _GPU_FACTS
            or (d.kind == "env" and (d.name == "LD_LIBRARY_PATH" or d.name.startswith(_GPU_ENV_PREFIXES)))
        ):
            return 1
        if module in _HUB_MODULES and (
            (d.kind == "env" and (d.name.startswith(_HUB_ENV_PREFIXES) or d.name == "TOKENIZERS_PARALLELISM"))
            or (d.kind == "package" and d.name == "huggingface_hub")
        ):
            return 1
        if module in _TORCH_USERS and ((d.kind == "package" and d.name == "torch") or d.kind == "torch_cuda"):
            return 1
        return 2
    if stage in ("cuda init", "cuda probe"):
        if d.kind in _CUDA_FACTS or (d.kind == "package" and d.name == "torch"):
            return 1
        if d.kind == "env" and (d.name in _CUDA_ENV or d.name.startswith(_GPU_ENV_PREFIXES)):
            return 1
        return 2
    if stage == "arguments":
        return 2
    if in_training or stage == "training":
        if d.kind in ("torch_cuda", "torch_hip", "cudnn", "driver", "gpu_count", "gpu_models"):
            return 1
        if d.kind == "package" and d.name in _TRAINING_PACKAGES:
            return 1
        if d.kind == "env" and (d.name in _TRAINING_ENV or d.name.startswith(_TRAINING_ENV_PREFIXES)):
            return 1
        return 2
    if stage:  # a user stage before training: loading a model or data, often from the hub
        if d.kind == "env" and d.name.startswith(_HUB_ENV_PREFIXES):
            return 1
        if d.kind == "package" and d.name in (
            "huggingface_hub",
            "transformers",
            "diffusers",
            "peft",
            "safetensors",
            "accelerate",
        ):
            return 1
    return 2


def split(drift: list[Drift], stage: Optional[str], in_training: bool = False) -> tuple[list[Drift], list[Drift]]:
    """``(bearing on the stage, the rest)``; the first list starts with what is about the stage
    itself. Without a stage, the slower phases come first."""
    if not stage:
        slow = [d for d in drift if d.kind == "phase"]
        return slow, [d for d in drift if d.kind != "phase"]
    ranked = [(_bears_on(d, stage, in_training), i, d) for i, d in enumerate(drift)]
    if any(d.kind == "phase" and d.name == stage for _, _, d in ranked):  # start-up would only repeat it
        ranked = [(2 if d.kind == "phase" and d.name == STARTUP else rank, i, d) for rank, i, d in ranked]
    return ([d for rank, _, d in sorted(ranked) if rank < 2], [d for rank, _, d in ranked if rank == 2])


def focus(journal: Journal) -> tuple[Optional[str], bool]:
    """``(stage, in_training)``: the stage a journal's process is stuck in (its deepest open span
    but the root), else the last that failed; ``(None, False)`` when there is none."""
    from lora_otel.journal.tree import deepest_open_span

    span = deepest_open_span(journal)
    if span is None or span is journal.root:
        failed = [s for s in journal.spans if s.status == "error" and s is not journal.root]
        span = failed[-1] if failed else None
    if span is None:
        return None, False
    return span.name, _inside_training(journal, span)


def _inside_training(journal: Journal, span: Optional[Span]) -> bool:
    seen = 0
    while span is not None and seen < 1000:
        if span.name == "training" or span.name.startswith("step "):
            return True
        span = journal.span(span.parent_id) if span.parent_id else None
        seen += 1
    return False


def brief(items: list[Drift], limit: int = 4) -> str:
    text = "; ".join(d.text for d in items[:limit])
    return text + (" (+%d more)" % (len(items) - limit) if len(items) > limit else "")


# --- inspect and the live diagnosis ----------------------------------------------------------


def inspect_report(
    journal: Journal, now_ns: Optional[int] = None, environ: Optional[Mapping[str, str]] = None
) -> Optional[dict[str, Any]]:
    """For ``lora-otel inspect``: None when ``LORA_OTEL_BASELINE`` is unset; else
    ``{"path", "error", "stage", "relevant", "other", "notes"}`` (drift as `Drift.to_json`).
    Never raises: a baseline that cannot be used gives ``error``, one line."""
    path = (os.environ if environ is None else environ).get(ENV_VARIABLE, "").strip()
    if not path:
        return None
    report: dict[str, Any] = {"path": path, "error": None, "stage": None, "relevant": [], "other": [], "notes": []}
    try:
        baseline = configured(journal, {ENV_VARIABLE: path})
        assert baseline is not None
        result = compare_journal(baseline, journal, now_ns)
        stage, in_training = focus(journal)
        relevant, other = split(result.drift, stage, in_training)
        report.update(stage=stage, relevant=relevant, other=other, notes=result.notes)
    except BaselineError as e:
        report["error"] = str(e)
    except Exception as e:  # noqa: BLE001 - a baseline never breaks inspect
        report["error"] = "%s=%s: cannot compare: %s: %s" % (ENV_VARIABLE, path, type(e).__name__, e)
    return report


MAX_IN_SENTENCE = 4


def stall_drift(
    baseline: Baseline, stall_span: Span, journal: Journal, now_ns: Optional[int] = None
) -> tuple[list[Drift], list[Drift]]:
    """``(bearing on the stalled stage, the rest)`` for the live stall diagnosis."""
    result = compare_journal(baseline, journal, now_ns)
    return split(result.drift, stall_span.name, _inside_training(journal, stall_span))


def sentence_prefix(relevant: list[Drift]) -> str:
    """``Drift from the baseline: bitsandbytes 0.43.1 → 0.45.0; .... `` (empty without drift)."""
    if not relevant:
        return ""
    return "Drift from the baseline: %s. " % brief(relevant, MAX_IN_SENTENCE)
