"""The one-shot environment self-check that runs inside the training process.

``collect()`` returns a flat dict of span attributes (str/int/bool values only) describing the
interpreter, the OS, the installed ML packages, the torch build, the NVIDIA driver and the
device/distributed/hub environment variables; ``lines()`` turns it into 2-4 short English lines.

It runs at interpreter start, so it is held to two rules: it imports nothing but ``os`` and
``sys`` (both already loaded by then; ``__future__`` is the one extra module), never the packages
it reports on, and it costs a few milliseconds at most. No function here raises: a fact that cannot
be found, read or parsed is simply missing from the result.

One module on purpose (~700 lines, a tenth of them this docstring): `collect` and `lines` run
together, once, at start in every traced process; a split would add a file to load there.

Where each fact comes from, and the limits of each source:

* **Python and OS** -- ``sys.version_info``, ``sys.version``, ``sys.implementation``,
  ``sys.platform``, ``sys.executable`` and ``os.uname()`` (not ``platform``, which imports ``re``).
  ``os.version`` is the kernel release; there is no distribution name (that would need
  ``/etc/os-release``). ``host.arch`` is mapped to the OpenTelemetry values (``x86_64`` ->
  ``amd64``, ``aarch64`` -> ``arm64``, ...); an unknown machine name is passed through as is.

* **Package versions** -- the names of the ``<name>-<version>.dist-info`` and
  ``<name>-<version>[-pyX.Y...].egg-info`` entries in the directories of ``sys.path``, each
  directory listed once (``os.listdir``) and the listing cached for the life of the process. Names
  are compared after PEP 503 normalisation (lowercase, runs of ``-_.`` become one ``_``); the first
  match in ``sys.path`` order wins, as with ``importlib.metadata``. Only when the entry's name has
  no version (a ``setup.py develop`` egg-info) is its ``PKG-INFO``/``METADATA`` file read. Limits:
  the answer is about ``sys.path`` *at the time of the call* (at interpreter start the script's own
  directory is not on it yet, and ``.pth`` files processed later may add more); distributions
  found only by a custom finder on ``sys.meta_path`` are not seen; a version that the installer
  wrote un-normalised into the directory name is reported as written; zip files on ``sys.path``
  are not looked into. A package that is installed is not necessarily importable (a broken
  install still has its dist-info).

* **torch build** -- the text of ``torch/version.py`` in the first ``sys.path`` directory that
  holds a ``torch/__init__.py``, parsed with string operations for the ``__version__``, ``cuda``,
  ``hip`` and ``git_version`` assignments (``cuda = '12.1'``, ``cuda: Optional[str] = None``).
  ``cuda`` is None for CPU (and ROCm) builds. A torch found some other way (a custom finder, a zip)
  is not seen. The file is written by torch's build and could in principle disagree with the
  binary, but never does in published wheels.

* **cuDNN** -- the version of the installed ``nvidia-cudnn-cu12`` (or ``-cu13``/``-cu11``)
  distribution, which is what pip-installed CUDA torch wheels load. A torch that bundles its own
  cuDNN (conda, source builds, old ``+cu1xx`` wheels) or uses a system cuDNN gives None here even
  though cuDNN is present; the only way to know for sure is ``torch.backends.cudnn.version()``,
  which needs torch imported.

* **NVIDIA driver** -- ``/proc/driver/nvidia/version`` (the ``Kernel Module  535.104.05`` text;
  both the proprietary and the open kernel module) and the number of entries in
  ``/proc/driver/nvidia/gpus/``. Linux only. Its absence means no NVIDIA kernel driver is visible
  *to this process*: a container started without the NVIDIA runtime sees none even when the host
  has one. The GPU count is what the driver exposes, before ``CUDA_VISIBLE_DEVICES``; it says
  nothing about whether the GPUs work (that needs CUDA initialised, i.e. torch).

* **Environment variables** -- the device, distributed, threading and hub variables
  (``RELEVANT_ENV_PREFIXES``, ``RELEVANT_ENV_NAMES``), each value passed through the ``redact``
  callable given by the caller, which takes the mapping of the relevant variables and returns the
  mapping to record (``lora_otel._boot.redact.redact_env``); a variable it drops or fails on is
  left out (fail closed). Without one, a built-in fallback replaces the value of any variable whose
  name looks secret (``TOKEN``, ``KEY``, ``SECRET``, ``PASSWORD``, ...) and strips
  ``user:password@`` from URLs; it is a safety net, not a replacement for the real redactor.
  Variables are recorded as they are at the time of the call.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Callable, Mapping

    Redactor = Callable[[dict[str, str]], Mapping[str, object]]
    """Takes the relevant variables, returns the mapping to record (``redact.redact_env``)."""

__all__ = [
    "PACKAGES",
    "RELEVANT_ENV_NAMES",
    "RELEVANT_ENV_PREFIXES",
    "clear_cache",
    "collect",
    "driver_facts",
    "lines",
    "package_version",
    "package_versions",
    "relevant_env",
    "torch_build",
]

PACKAGES = [
    "torch",
    "transformers",
    "diffusers",
    "peft",
    "accelerate",
    "bitsandbytes",
    "xformers",
    "safetensors",
    "numpy",
    "huggingface_hub",
    "tokenizers",
    "triton",
    "deepspeed",
    "lightning",
    "pytorch_lightning",
]

# Variables whose name starts with one of these are recorded.
RELEVANT_ENV_PREFIXES = (
    "CUDA_",  # CUDA_VISIBLE_DEVICES, CUDA_LAUNCH_BLOCKING, CUDA_HOME, CUDA_DEVICE_ORDER, ...
    "NVIDIA_",  # NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES (container runtime)
    "NCCL_",
    "TORCH_",  # TORCH_DISTRIBUTED_DEBUG, TORCH_NCCL_*, TORCH_HOME, ...
    "TORCHELASTIC_",
    "TORCHINDUCTOR_",
    "PYTORCH_",  # PYTORCH_CUDA_ALLOC_CONF, ...
    "HF_",  # HF_HOME, HF_HUB_OFFLINE, HF_TOKEN (redacted), ...
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "ACCELERATE_",
)

# Variables recorded by exact name.
RELEVANT_ENV_NAMES = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "CUBLAS_WORKSPACE_CONFIG",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_JOB_ID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "PYTHONUNBUFFERED",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
    }
)

# sys.path directory -> {normalised name: (version or None, entry name)}, or {} when unreadable.
_DIST_INDEX: dict[str, dict[str, tuple[str | None, str]]] = {}
# sys.path directory -> set of all entry names (used to find the torch package directory).
_LISTINGS: dict[str, frozenset[str]] = {}

_CUDNN_DISTS = ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn-cu11")
_NVIDIA_VERSION_FILE = "/proc/driver/nvidia/version"
_NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"

_OTEL_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "i386": "x86",
    "i486": "x86",
    "i586": "x86",
    "i686": "x86",
    "x86": "x86",
    "ppc64": "ppc64",
    "ppc64le": "ppc64",
    "ppc": "ppc32",
    "s390x": "s390x",
    "ia64": "ia64",
}
_ARCH_DISPLAY = {"amd64": "x86_64", "arm64": "aarch64"}


def clear_cache() -> None:
    """Forget the cached directory listings (for tests, or after sys.path changed on disk)."""
    _DIST_INDEX.clear()
    _LISTINGS.clear()


def _normalize(name: str) -> str:
    """PEP 503 normalisation, spelled with ``_``: lowercase, runs of ``-_.`` become one ``_``."""
    s = name.lower().replace("-", "_").replace(".", "_")
    while "__" in s:
        s = s.replace("__", "_")
    return s


def _dir_key(entry: object) -> str | None:
    if not isinstance(entry, str):
        return None
    return entry or "."  # '' on sys.path means the working directory


def _listing(directory: str) -> frozenset[str]:
    cached = _LISTINGS.get(directory)
    if cached is not None:
        return cached
    try:
        # A directory everyone can write to (``python -c`` run in /tmp puts it on sys.path) holds
        # no package facts: a stranger's ``numpy-9.9.dist-info`` there is not the environment's.
        names = frozenset() if os.stat(directory).st_mode & 0o002 else frozenset(os.listdir(directory))
    except Exception:  # noqa: BLE001 - not a directory, a zip file, gone, no permission, ...
        names = frozenset()
    if directory != ".":  # the working directory can change; don't cache it
        _LISTINGS[directory] = names
    return names


def _split_entry(stem: str, egg: bool) -> tuple[str, str | None]:
    """``Foo_Bar-1.2.3`` -> ("Foo_Bar", "1.2.3"); egg-info drops ``-py3.11[-platform]``.

    The name ends at the first ``-`` followed by a digit (a PEP 440 version starts with one), so a
    legacy unescaped ``Foo-Bar-1.0`` still splits right.
    """
    i = stem.find("-")
    while i != -1:
        if i + 1 < len(stem) and stem[i + 1].isdigit():
            version = stem[i + 1 :]
            if egg:
                version = version.split("-", 1)[0]
            return stem[:i], version or None
        i = stem.find("-", i + 1)
    return stem, None


def _dist_index(directory: str) -> dict[str, tuple[str | None, str]]:
    cached = _DIST_INDEX.get(directory)
    if cached is not None:
        return cached
    index: dict[str, tuple[str | None, str]] = {}
    for entry in _listing(directory):
        if entry.endswith(".dist-info"):
            name, version = _split_entry(entry[:-10], egg=False)
        elif entry.endswith(".egg-info"):
            name, version = _split_entry(entry[:-9], egg=True)
        else:
            continue
        key = _normalize(name)
        if key and key not in index:
            index[key] = (version, entry)
    if directory != ".":
        _DIST_INDEX[directory] = index
    return index


def _read_head(path: str, size: int) -> bytes:
    """The first ``size`` bytes of the regular file ``path``, opened without blocking: a FIFO planted
    where a package's files are looked for (the working directory is on ``sys.path``, and may be
    ``/tmp``) is neither waited on nor read (``OSError``). As `files.read_head`, without loading it."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0) | os.O_NOCTTY)
    try:
        if os.fstat(fd).st_mode & 0o170000 != 0o100000:  # S_ISREG, without loading stat
            raise OSError("%s is not a regular file" % path)
        return os.read(fd, size)
    finally:
        os.close(fd)


def _version_from_metadata(path: str) -> str | None:
    """The ``Version:`` header of a METADATA/PKG-INFO file (or egg-info file), or None."""
    candidates = [os.path.join(path, "METADATA"), os.path.join(path, "PKG-INFO")] if os.path.isdir(path) else [path]
    for candidate in candidates:
        try:
            head = _read_head(candidate, 8192)  # never waits on a FIFO (a shared working directory)
        except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
            continue
        for raw in head.split(b"\n"):
            line = raw.strip()
            if not line:
                break  # end of the headers
            if line[:8].lower() == b"version:":
                value = line[8:].strip().decode("utf-8", "replace")
                return value or None
    return None


def package_versions(names: list[str]) -> dict[str, str | None]:
    """Installed versions of the given distributions, from the dist-info/egg-info entries on
    ``sys.path`` (first match in path order wins); None for those not installed."""
    result: dict[str, str | None] = {}
    try:
        wanted: dict[str, list[str]] = {}
        for name in names:
            result[name] = None
            try:
                wanted.setdefault(_normalize(name), []).append(name)
            except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
                pass
        if not wanted:
            return result
        remaining = set(wanted)
        for entry in list(sys.path):
            directory = _dir_key(entry)
            if directory is None:
                continue
            index = _dist_index(directory)
            if not index:
                continue
            for key in list(remaining):
                hit = index.get(key)
                if hit is None:
                    continue
                remaining.discard(key)
                version, dist_entry = hit
                if version is None:
                    version = _version_from_metadata(os.path.join(directory, dist_entry))
                for original in wanted[key]:
                    result[original] = version
            if not remaining:
                break
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    return result


def package_version(name: str) -> str | None:
    """The installed version of one distribution, or None."""
    return package_versions([name]).get(name)


def _parse_assignments(text: str, keys: tuple[str, ...]) -> dict[str, str | None]:
    """Top-level ``key = 'str'`` / ``key: T = 'str'`` / ``key = None`` assignments; last one wins."""
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        if not line or line[0] in " \t#":
            continue  # only module-level statements
        for key in keys:
            if not line.startswith(key):
                continue
            rest = line[len(key) :]
            if not rest or rest[0] not in " \t:=":
                continue  # a longer name, e.g. cuda_foo
            rest = rest.lstrip()
            if rest.startswith(":"):  # annotation
                eq = rest.find("=")
                if eq == -1:
                    break
                rest = rest[eq:]
            if not rest.startswith("=") or rest.startswith("=="):
                break
            value = rest[1:].strip()
            if value[:1] in ("'", '"'):
                quote = value[0]
                end = value.find(quote, 1)
                if end != -1:
                    found[key] = value[1:end]
            elif value.startswith("None"):
                found[key] = None
            break
    return found


def _torch_dir() -> str | None:
    for entry in list(sys.path):
        directory = _dir_key(entry)
        if directory is None or "torch" not in _listing(directory):
            continue
        candidate = os.path.join(directory, "torch")
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    return None


def torch_build() -> dict[str, str | None]:
    """What torch was built for, without importing it.

    Keys: ``torch.version``, ``torch.cuda_build`` (None for a CPU build), ``torch.hip_build``,
    ``torch.git_version``, ``cudnn.version`` (from the nvidia-cudnn-cu1x distribution). All None
    when torch is not found.
    """
    facts: dict[str, str | None] = {
        "torch.version": None,
        "torch.cuda_build": None,
        "torch.hip_build": None,
        "torch.git_version": None,
        "cudnn.version": None,
    }
    try:
        torch_dir = _torch_dir()
        if torch_dir is None:
            return facts
        parsed: dict[str, str | None] = {}
        try:
            text = _read_head(os.path.join(torch_dir, "version.py"), 65536).decode("utf-8", "replace")
            parsed = _parse_assignments(text, ("__version__", "cuda", "hip", "git_version"))
        except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
            pass
        facts["torch.version"] = parsed.get("__version__") or package_version("torch")
        facts["torch.cuda_build"] = parsed.get("cuda")
        facts["torch.hip_build"] = parsed.get("hip")
        facts["torch.git_version"] = parsed.get("git_version")
        # Prefer the cuDNN that matches the CUDA major torch was built for.
        order = list(_CUDNN_DISTS)
        cuda = facts["torch.cuda_build"]
        if cuda:
            major = "nvidia-cudnn-cu" + cuda.split(".", 1)[0]
            if major in order:
                order.remove(major)
                order.insert(0, major)
        versions = package_versions(order)
        for dist in order:
            if versions.get(dist):
                facts["cudnn.version"] = versions[dist]
                break
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    return facts


def _looks_like_version(token: str) -> bool:
    return "." in token and token.replace(".", "").isdigit()


def driver_facts() -> dict[str, object]:
    """``nvidia.driver_version`` (str) and ``nvidia.gpu_count`` (int) from /proc; absent keys when
    not found."""
    facts: dict[str, object] = {}
    try:
        with open(_NVIDIA_VERSION_FILE, "rb") as f:
            text = f.read(65536).decode("utf-8", "replace")
        for line in text.splitlines():
            at = line.find("Kernel Module")
            if at == -1:
                continue
            # "NVIDIA UNIX x86_64 Kernel Module  535.104.05  Tue Aug 22 ..." or
            # "NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build ..."
            for token in line[at + 13 :].split():
                if _looks_like_version(token):
                    facts["nvidia.driver_version"] = token
                    break
            if "nvidia.driver_version" in facts:
                break
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        gpus = [e for e in os.listdir(_NVIDIA_GPUS_DIR) if not e.startswith(".")]
        facts["nvidia.gpu_count"] = len(gpus)
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    return facts


_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH", "COOKIE")


def _fallback_redact(env: dict[str, str]) -> dict[str, str]:
    """Safety net used when no redactor is given: hide secret-looking variables, URL passwords."""
    out: dict[str, str] = {}
    for name, value in env.items():
        upper = name.upper()
        if any(marker in upper for marker in _SECRET_MARKERS):
            out[name] = "[REDACTED]" if value else ""
            continue
        scheme = value.find("://")
        if scheme != -1:
            at = value.find("@", scheme + 3)
            slash = value.find("/", scheme + 3)
            if at != -1 and (slash == -1 or at < slash):
                value = value[: scheme + 3] + "[REDACTED]" + value[at:]
        out[name] = value
    return out


def _is_relevant(name: str) -> bool:
    return name in RELEVANT_ENV_NAMES or name.startswith(RELEVANT_ENV_PREFIXES)


def _apply_redact(redact: Redactor, subset: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    red = redact(subset)
    for name in subset:  # only names we asked about, in our order; dropped names stay dropped
        if name in red:
            value = red[name]
            if value is not None:
                out[name] = value if isinstance(value, str) else str(value)
    return out


def relevant_env(environ: Mapping[str, str] | None = None, redact: Redactor | None = None) -> dict[str, str]:
    """The device/distributed/hub variables of ``environ`` (default ``os.environ``), sorted by
    name, after ``redact``.

    ``redact`` takes a mapping of name -> value and returns the mapping to record (the contract of
    ``lora_otel._boot.redact.redact_env``); it sees only the relevant variables. A name missing
    from its result is left out. If it raises on the whole subset it is retried one variable at a
    time, and a variable that still fails is left out (fail closed: no unredacted value is ever
    recorded). Without ``redact`` a conservative built-in fallback is used.
    """
    try:
        if environ is None:
            environ = os.environ
        if redact is None:
            redact = _fallback_redact
        subset: dict[str, str] = {}
        for name in sorted(k for k in list(environ.keys()) if isinstance(k, str) and _is_relevant(k)):
            try:
                value = environ[name]
            except Exception:  # noqa: BLE001 - fail closed: a variable the redactor fails on is left out
                continue
            if isinstance(value, str):
                subset[name] = value
        if not subset:
            return {}
        try:
            return _apply_redact(redact, subset)
        except Exception:  # noqa: BLE001 - fail closed: a variable the redactor fails on is left out
            pass
        out: dict[str, str] = {}
        for name, value in subset.items():
            try:
                out.update(_apply_redact(redact, {name: value}))
            except Exception:  # noqa: BLE001 - fail closed: a variable the redactor fails on is left out
                continue
        return out
    except Exception:  # noqa: BLE001 - fail closed: a variable the redactor fails on is left out
        return {}


def _runtime_version() -> str:
    v = sys.version_info
    text = "%d.%d.%d" % (v[0], v[1], v[2])
    level = {"alpha": "a", "beta": "b", "candidate": "rc"}.get(v[3])
    if level:
        text += "%s%d" % (level, v[4])
    return text


def _os_type() -> str:
    p = sys.platform
    if p.startswith("linux"):
        return "linux"
    if p == "win32" or p == "cygwin":
        return "windows"
    for prefix in ("freebsd", "openbsd", "netbsd", "dragonfly", "aix", "sunos"):
        if p.startswith(prefix):
            return "solaris" if prefix == "sunos" else prefix
    return p  # "darwin", ...


def collect(environ: Mapping[str, str] | None = None, redact: Redactor | None = None) -> dict[str, object]:
    """All facts as flat span attributes (values str/int/bool; unknown facts are absent)."""
    facts: dict[str, object] = {}

    def put(key: str, value: object) -> None:
        if isinstance(value, (str, int, bool)):  # bool is an int
            facts[key] = value

    try:
        put("process.runtime.name", sys.implementation.name)
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        put("process.runtime.version", _runtime_version())
        put("process.runtime.description", " ".join(sys.version.split()))
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        put("os.type", _os_type())
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        uname = os.uname()
        put("os.version", uname.release)
        put("host.arch", _OTEL_ARCH.get(uname.machine.lower(), uname.machine))
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        put("lora_otel.python.executable", sys.executable)
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        for name, version in package_versions(PACKAGES).items():
            if version:
                put("lora_otel.pkg." + name, version)
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        build = torch_build()
        if build.get("torch.version") and "lora_otel.pkg.torch" not in facts:
            put("lora_otel.pkg.torch", build["torch.version"])
        for src, dst in (
            ("torch.cuda_build", "lora_otel.torch.cuda_build"),
            ("torch.hip_build", "lora_otel.torch.hip_build"),
            ("cudnn.version", "lora_otel.cudnn.version"),
        ):
            if build.get(src):
                put(dst, build[src])
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        for key, value in driver_facts().items():
            put("lora_otel." + key, value)
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    try:
        for name, value in relevant_env(environ, redact).items():
            put("lora_otel.env." + name, value)
    except Exception:  # noqa: BLE001 - a fact that cannot be found or read is left out (module docstring)
        pass
    return facts


# The packages mentioned as "not installed" when missing; the rest only when present.
_CORE_PACKAGES = ("torch", "transformers", "peft")
# The order in which variables are shown in the env line; the rest follow alphabetically.
_ENV_FIRST = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS",
)
_ENV_LINE_MAX = 400
_ENV_VALUE_MAX = 60


def lines(facts: Mapping[str, object]) -> list[str]:
    """2-4 short English lines summarising ``collect()``'s facts."""
    out: list[str] = []
    try:
        out.append(_environment_line(facts))
    except Exception:  # noqa: BLE001 - a summary line that cannot be made is left out
        pass
    try:
        out.append(_env_line(facts))
    except Exception:  # noqa: BLE001 - a summary line that cannot be made is left out
        pass
    try:
        out.append(_cuda_line(facts))
    except Exception:  # noqa: BLE001 - a summary line that cannot be made is left out
        pass
    return out


def _environment_line(facts: Mapping[str, object]) -> str:
    parts = []
    runtime = facts.get("process.runtime.version")
    impl = facts.get("process.runtime.name")
    name = "Python" if impl in (None, "cpython") else "Python (%s)" % impl
    parts.append("%s %s" % (name, runtime) if runtime else "Python (version unknown)")
    arch = facts.get("host.arch")
    # a fact's value is an object to mypy; get() of one that is not a str finds nothing, as it should
    display = _ARCH_DISPLAY.get(arch, arch)  # type: ignore[call-overload]
    system = " ".join(str(x) for x in (facts.get("os.type"), display) if x)
    if system:
        parts.append(system)
    for pkg in PACKAGES:
        version = facts.get("lora_otel.pkg." + pkg)
        if pkg == "torch":
            if version:
                if facts.get("lora_otel.torch.cuda_build"):
                    build = "CUDA %s build" % facts["lora_otel.torch.cuda_build"]
                elif facts.get("lora_otel.torch.hip_build"):
                    build = "ROCm/HIP %s build" % facts["lora_otel.torch.hip_build"]
                else:
                    build = "CPU build"
                parts.append("torch %s (%s)" % (version, build))
            else:
                parts.append("torch not installed")
        elif version:
            parts.append("%s %s" % (pkg, version))
        elif pkg in _CORE_PACKAGES:
            parts.append("%s not installed" % pkg)
    return "environment: " + ", ".join(parts)


def _env_line(facts: Mapping[str, object]) -> str:
    prefix = "lora_otel.env."
    env = {k[len(prefix) :]: str(v) for k, v in facts.items() if k.startswith(prefix)}
    if not env:
        return "env: no device, distributed or hub variables set"
    order = [n for n in _ENV_FIRST if n in env] + sorted(n for n in env if n not in _ENV_FIRST)
    text = "env:"
    for i, name in enumerate(order):
        value = env[name]
        if len(value) > _ENV_VALUE_MAX:
            value = value[: _ENV_VALUE_MAX - 3] + "..."
        if " " in value or value == "":
            value = '"%s"' % value
        item = " %s=%s" % (name, value)
        if len(text) + len(item) > _ENV_LINE_MAX:
            text += " (+%d more)" % (len(order) - i)
            break
        text += item
    return text


def _cuda_line(facts: Mapping[str, object]) -> str:
    driver = facts.get("lora_otel.nvidia.driver_version")
    gpus = facts.get("lora_otel.nvidia.gpu_count")
    torch = facts.get("lora_otel.pkg.torch")
    cuda = facts.get("lora_otel.torch.cuda_build")
    hip = facts.get("lora_otel.torch.hip_build")
    cudnn = facts.get("lora_otel.cudnn.version")
    parts = []
    if driver:
        text = "driver %s" % driver
        if isinstance(gpus, int) and not isinstance(gpus, bool):
            text += " (%d GPU%s)" % (gpus, "" if gpus == 1 else "s")
        parts.append(text)
    elif facts.get("os.type") == "linux":
        parts.append("no NVIDIA driver found (/proc/driver/nvidia/version missing)")
    else:
        parts.append("no NVIDIA driver information (read on Linux only)")
    if not torch:
        parts.append("torch not installed")
    elif cuda:
        parts.append("torch built for CUDA %s" % cuda)
        parts.append("cuDNN %s" % cudnn if cudnn else "cuDNN version unknown")
        if not driver:
            parts.append("so torch will not see a GPU")
    elif hip:
        parts.append("torch built for ROCm/HIP %s" % hip)
    else:
        parts.append("torch is a CPU build" + (", so it will not use the GPUs" if driver else ""))
    visible = facts.get("lora_otel.env.CUDA_VISIBLE_DEVICES")
    if visible is not None and str(visible).strip() in ("", "-1"):
        parts.append("CUDA_VISIBLE_DEVICES=%r hides every GPU" % str(visible))
    return "CUDA: " + ", ".join(parts)
