"""``lora-otel doctor``: the start-up of a LoRA training job, run once, traced, with a verdict per step.

Two processes. The **parent** (``lora-otel doctor``) does the checks that need nothing imported and
judges everything; the **check process** (``python -m lora_otel.cli.doctor --child``, started
with ``LORA_OTEL=1``) does what a real job does first, traced like a real job: its preamble writes a
journal (``--dir``, else ``$LORA_OTEL_DIR``, else ``./lora-otel/``, named ``doctor-<UTC>-<pid>``)
and, when an OTLP endpoint is configured, starts the live-export sidecar. The check process

1. imports the training stack, each package under its own ``import NAME`` span (the import hook
   makes it): torch, transformers, diffusers, accelerate, peft, bitsandbytes, xformers, those that
   are installed, then the ``--also-import`` modules;
2. probes and initialises CUDA (the torch hooks make the ``cuda probe`` / ``cuda init`` spans);
3. on each visible GPU allocates, multiplies two 1024x1024 matrices and reads the result back,
   compared against the CPU (a ``gpu N matmul`` stage);
4. when peft is installed, one LoRA forward and backward on a tiny model (a 1-layer Llama from
   transformers when it imports, else a two-layer MLP), on GPU 0 when it works, else the CPU.

It tells the parent where it is over a pipe (one JSON line as each step begins and ends); its own
stdout and stderr go to ``<journal stem>.log`` beside the journal. The parent holds every step to a
time limit (``--import-timeout``, ``--cuda-timeout``, ``--gpu-timeout``, ``--lora-timeout``). A step
past its limit is a hang: the parent gathers the evidence (``evidence.gather``: the process state
and wait channel from /proc and every thread's Python stack through the stack request signal), kills the check
process's whole process group, appends the ``exit`` record to the journal and reports the step as
failed, with the innermost frames of the stack and their source lines. A check process that dies
(a segfault in a native library) fails the step it was in, with the tail of its log.

The parent's own checks: the Python version against ``Requires-Python`` of lora_otel and of every
installed training-stack package; each such package's declared requirements (package metadata,
markers evaluated for this interpreter, extras ignored) against what is installed; torch's CUDA
build against the CUDA version the NVIDIA driver supports (``cuDriverGetVersion`` from
``libcuda.so.1``, else a table of minimum driver versions); free GPU memory (measured in the check
process after CUDA initialised) against ``--need-gpu-memory``.

Standard library only, plus ``packaging`` when it is importable (a small built-in parser for
versions, specifiers and markers otherwise). Statuses: ``ok``, ``warn``, ``fail``; exit status 0
without a fail, 1 with one, 2 on a usage error. See docs/doctor.md.

This module is also the check process's ``__main__``: it imports nothing at module level but what
every interpreter has loaded (``os``, ``sys``, ``time``), so that the journal's import spans are the
training stack's and not the doctor's own.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = [
    "EPILOG",
    "STACK",
    "Check",
    "add_arguments",
    "arch_supported",
    "check_cuda_build",
    "check_python",
    "check_requirements",
    "doctor",
    "driver_cuda_version",
    "format_bytes",
    "max_cuda_for_driver",
    "parse_size",
    "render_text",
    "run_doctor",
    "stack_excerpt",
]

STACK = ("torch", "transformers", "diffusers", "accelerate", "peft", "bitsandbytes", "xformers")
"""The training stack, in import order (a package after the ones it imports, so each span is its own)."""

DEFAULT_TIMEOUTS = {"import": 120.0, "cuda": 120.0, "gpu": 60.0, "lora": 120.0}
EXIT_LIMIT_S = 30.0
"""How long the check process may take to exit after its last step."""
MATMUL_N = 1024
LORA_OTEL_REQUIRES_PYTHON = ">=3.9"

_PROTO_ENV = "LORA_OTEL_DOCTOR_FD"
# The check process runs ``python -c _CHILD_CODE``: ``python -m`` would add ``import runpy`` and
# ``import lora_otel.export`` spans to its journal; this imports the doctor as lora_otel (untraced).
_CHILD_CODE = (
    "import sys; d = __import__('lora_otel.cli.doctor', {'__name__': 'lora_otel'}, None, ['_child_main']); "
    "sys.exit(d._child_main(sys.argv[1:]))"
)
_PROGRAM = {"__name__": "__main__"}  # import as the program: the import hook traces it
_QUIET = {"__name__": "lora_otel.cli.doctor"}  # import as lora_otel: not traced

EPILOG = """examples:
  lora-otel doctor                               the whole start-up flow, one line per check
  lora-otel doctor --need-gpu-memory 40G         ... and at least 40 GiB free on every visible GPU
  lora-otel doctor --also-import mytrain.data    ... and import your own modules too
  lora-otel doctor --import-timeout 300 --import-timeout bitsandbytes=600
  lora-otel doctor --json | jq '.checks[] | select(.status != "ok")'
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 lora-otel doctor   the run exported live too

sizes: 16G, 16GiB, 16Gi = 16 x 2^30 bytes; 16GB = 16 x 10^9; also K, M, T; a plain number is bytes.
exit status: 0 no check failed (warnings allowed), 1 some check failed, 2 usage error.
The check process's journal is written like a real job's (docs/journal.md); docs/doctor.md."""


# --- results -----------------------------------------------------------------------------------


class Check:
    """One line of the report: ``name``, ``status`` (ok/warn/fail), ``evidence``, ``advice``."""

    __slots__ = ("advice", "details", "duration_s", "evidence", "name", "status")

    def __init__(
        self,
        name: str,
        status: str,
        evidence: str,
        advice: str | None = None,
        duration_s: float | None = None,
        details: dict | None = None,
    ) -> None:
        if status not in ("ok", "warn", "fail"):
            raise ValueError("status must be ok, warn or fail, not %r" % (status,))
        self.name = name
        self.status = status
        self.evidence = evidence
        self.advice = advice
        self.duration_s = None if duration_s is None else round(float(duration_s), 3)
        self.details = details or {}

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "evidence": self.evidence,
            "advice": self.advice,
            "duration_s": None if self.duration_s is None else round(float(self.duration_s), 3),
            "details": self.details,
        }

    def __repr__(self) -> str:
        return "Check(%r, %r, %r)" % (self.name, self.status, self.evidence)


# --- sizes and times --------------------------------------------------------------------------

_UNITS = {"": 1, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(text: str) -> int:
    """``16G``/``16GiB``/``16Gi`` → 16 * 2**30; ``16GB`` → 16 * 10**9; ``512M``; ``1.5T``; ``1000`` bytes.

    Raises ``ValueError`` with a one-line message on anything else.
    """
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtT]?)(i?)([bB]?)\s*", text or "")
    if not m or (m.group(3) and not m.group(2)) or (m.group(4) and not m.group(2) and m.group(3)):
        raise ValueError("%r is not a size; use e.g. 16G, 16GiB, 16GB or 512M" % (text,))
    number, unit, binary, byte = float(m.group(1)), m.group(2).upper(), m.group(3), m.group(4)
    if not unit:
        return int(number)
    base = 1000 if (byte and not binary) else 1024
    return int(number * base ** _UNITS[unit])


def format_bytes(n: float) -> str:
    """``17179869184`` → ``16 GiB``; ``150323855360`` → ``140 GiB``; ``1610612736`` → ``1.5 GiB``."""
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if abs(n) >= 1024**power:
            value = n / 1024**power
            text = ("%.1f" % value).rstrip("0").rstrip(".") if value < 100 else "%.0f" % value
            return "%s %s" % (text, unit)
    return "%d B" % n


def _secs(s: float) -> str:
    if s < 0.01:
        return "%.0f ms" % (s * 1000)
    if s < 1:
        return "%.2f s" % s
    if s < 100:
        return "%.1f s" % s
    return "%.0f s" % s


def _limit(s: float) -> str:
    return ("%g s" % s) if s < 100 else "%.0f s" % s


# --- versions, specifiers, markers (packaging when importable, else a small fallback) ----------


def _packaging():
    """``(Requirement, SpecifierSet, Version, InvalidVersion, Marker)`` from packaging, or None."""
    try:
        from packaging.markers import Marker
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        return Requirement, SpecifierSet, Version, InvalidVersion, Marker
    except Exception:  # noqa: BLE001 - not installed, or broken: the fallback serves
        return None


_USE_PACKAGING = True
"""Tests set this False to exercise the fallback parser."""


_PEP440 = (
    r"\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>\d*))?"
    r"(?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d*))?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*"
)


def _parse_version(text: str):
    """A PEP 440 version (fallback) as a dict: ``release`` (list), ``pre``/``post``/``dev`` (or None),
    ``local``, and ``key`` (sortable as packaging sorts, local ignored); None when it is not one."""
    import re

    m = re.fullmatch(_PEP440, text or "", re.IGNORECASE)
    if not m:
        return None
    release = [int(x) for x in m.group("release").split(".")]
    trimmed = list(release)
    while len(trimmed) > 1 and trimmed[-1] == 0:
        trimmed.pop()
    pre = None
    if m.group("pre_l"):
        letter = m.group("pre_l").lower()
        letter = {"alpha": "a", "beta": "b", "c": "rc", "pre": "rc", "preview": "rc"}.get(letter, letter)
        pre = ({"a": 0, "b": 1, "rc": 2}[letter], int(m.group("pre_n") or 0))
    post = None
    if m.group("post_n1") is not None:
        post = int(m.group("post_n1"))
    elif m.group("post_l"):
        post = int(m.group("post_n2") or 0)
    dev = int(m.group("dev_n") or 0) if m.group("dev_l") else None
    inf = float("inf")
    if pre is None and post is None and dev is not None:
        pre_k: tuple = (-inf,)  # 1.0.dev1 sorts before 1.0a1
    elif pre is None:
        pre_k = (inf,)
    else:
        pre_k = pre
    key = (
        int(m.group("epoch") or 0),
        tuple(trimmed),
        pre_k,
        (-inf,) if post is None else (post,),
        (inf,) if dev is None else (dev,),
    )
    return {"release": release, "pre": pre, "post": post, "dev": dev, "local": m.group("local"), "key": key}


def _version_key(text: str):
    v = _parse_version(text)
    return None if v is None else v["key"]


def _fallback_contains(spec: str, version: str) -> bool:
    """Whether ``version`` satisfies the comma-separated specifiers ``spec`` (fallback, PEP 440 lite:
    pre-releases allowed, local versions ignored unless the specifier has one)."""
    import re

    v = _parse_version(version)
    if v is None:
        return True  # an unparsable installed version: cannot judge, so not flagged
    public = _parse_version(version.split("+", 1)[0])
    for clause in (c.strip() for c in spec.split(",")):
        if not clause:
            continue
        m = re.fullmatch(r"(===|==|!=|~=|<=|>=|<|>)\s*(\S+)", clause)
        if not m:
            return True
        op, target = m.groups()
        if op == "===":
            if version.strip() != target:
                return False
            continue
        if target.endswith(".*") and op in ("==", "!="):
            t = _parse_version(target[:-2])
            if t is None:
                return True
            n = len(t["release"])
            mine = (public["release"] + [0] * n)[:n]
            match = mine == t["release"] and (t["pre"] is None or t["pre"] == public["pre"])
            if (op == "==") != match:
                return False
            continue
        t = _parse_version(target)
        if t is None:
            return True
        tk = t["key"]
        vk = (v if t["local"] else public)["key"]
        same = vk == tk and (not t["local"] or (v["local"] or "").lower() == t["local"].lower())
        if (op == "==" and not same) or (op == "!=" and same):
            return False
        if (op == ">=" and vk < tk) or (op == "<=" and vk > tk):
            return False
        if op == ">":
            # >V excludes V's post-releases (and V itself), unless V is one
            if not vk > tk or (t["post"] is None and public["post"] is not None and public["key"][:3] == tk[:3]):
                return False
        if op == "<":
            # <V excludes V's pre-releases, unless V is one
            if not vk < tk or (
                t["pre"] is None
                and t["dev"] is None
                and public["key"][:2] == tk[:2]
                and (public["pre"] is not None or public["dev"] is not None)
            ):
                return False
        if op == "~=":
            upper = t["release"][:-1]
            if vk < tk or (public["release"] + [0] * len(upper))[: len(upper)] != upper:
                return False
    return True


def _marker_env() -> dict:
    import platform

    impl = sys.implementation
    iv = impl.version
    impl_version = "%d.%d.%d" % (iv.major, iv.minor, iv.micro)
    if iv.releaselevel != "final":
        impl_version += iv.releaselevel[0] + str(iv.serial)
    return {
        "python_version": "%d.%d" % sys.version_info[:2],
        "python_full_version": platform.python_version(),
        "os_name": os.name,
        "sys_platform": sys.platform,
        "platform_system": platform.system(),
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_version": platform.version(),
        "platform_python_implementation": platform.python_implementation(),
        "implementation_name": impl.name,
        "implementation_version": impl_version,
        "extra": "",
    }


_VERSION_VARS = ("python_version", "python_full_version", "implementation_version", "platform_release")


def _fallback_marker(text: str, env: dict) -> bool:
    """Evaluate a PEP 508 marker (fallback): ``and``/``or``/parentheses, comparisons, ``in``/``not in``."""
    import re

    tokens = re.findall(
        r"\(|\)|'[^']*'|\"[^\"]*\"|===|==|!=|~=|<=|>=|<|>|not\s+in\b|\bin\b|\band\b|\bor\b|[\w.]+", text
    )
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def value(tok):
        if tok[:1] in ("'", '"'):
            return tok[1:-1], False
        return str(env.get(tok, "")), tok in _VERSION_VARS

    def comparison():
        if peek() == "(":
            take()
            r = expr()
            if peek() == ")":
                take()
            return r
        left, lver = value(take())
        op = re.sub(r"\s+", " ", take())
        right, rver = value(take())
        if op == "in":
            return left in right
        if op == "not in":
            return left not in right
        if (lver or rver) and _version_key(left) is not None and _version_key(right) is not None:
            return (
                _fallback_contains("%s%s" % (op, right), left)
                if lver
                else _fallback_contains(
                    "%s%s" % ({"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op), left), right
                )
            )
        return {
            "==": left == right,
            "!=": left != right,
            "<": left < right,
            ">": left > right,
            "<=": left <= right,
            ">=": left >= right,
            "===": left == right,
            "~=": left == right,
        }.get(op, False)

    def conjunction():
        r = comparison()
        while peek() == "and":
            take()
            r = comparison() and r
        return r

    def expr():
        r = conjunction()
        while peek() == "or":
            take()
            r = conjunction() or r
        return r

    try:
        return bool(expr())
    except Exception:  # noqa: BLE001 - an unreadable marker: count the requirement as applying
        return True


def _parse_requirement(text: str):
    """``(name, specifier text, marker text or None, url or None)`` of a PEP 508 line, or None."""
    import re

    m = re.fullmatch(
        r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*"
        r"(?:@\s*([^;\s]+)\s*|\(?\s*([^;()]*?)\s*\)?\s*)(?:;\s*(.*))?",
        text,
    )
    if not m:
        return None
    return m.group(1), (m.group(3) or "").replace(" ", ""), m.group(4), m.group(2)


class _Req:
    __slots__ = ("marker", "name", "spec", "text", "url")

    def __init__(self, name, spec, marker, url, text):
        self.name, self.spec, self.marker, self.url, self.text = name, spec, marker, url, text


def _requirement(text: str, env: dict):
    """The requirement ``text`` if it applies here (marker true with no extra), else None."""
    pk = _packaging() if _USE_PACKAGING else None
    if pk is not None:
        Requirement = pk[0]
        try:
            r = Requirement(text)
        except Exception:  # noqa: BLE001
            return None
        if r.marker is not None:
            try:
                if not r.marker.evaluate({"extra": ""}):
                    return None
            except Exception:  # noqa: BLE001
                return None
        return _Req(r.name, str(r.specifier), str(r.marker) if r.marker else None, r.url, text)
    parsed = _parse_requirement(text)
    if parsed is None:
        return None
    name, spec, marker, url = parsed
    if marker and not _fallback_marker(marker, env):
        return None
    return _Req(name, spec, marker, url, text)


def _contains(spec: str, version: str) -> bool:
    if not spec:
        return True
    pk = _packaging() if _USE_PACKAGING else None
    if pk is not None:
        _, SpecifierSet, Version, InvalidVersion, _ = pk
        try:
            return SpecifierSet(spec).contains(Version(version), prereleases=True)
        except (InvalidVersion, ValueError):
            return True  # an unparsable version or specifier: cannot judge, not flagged
        except Exception:  # noqa: BLE001
            return True
    return _fallback_contains(spec, version)


# --- package metadata --------------------------------------------------------------------------


def _norm(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _dist(name: str):
    from importlib import metadata

    try:
        return metadata.distribution(name)
    except Exception:  # noqa: BLE001 - PackageNotFoundError, or a broken dist-info
        return None


def _dist_version(name: str) -> str | None:
    d = _dist(name)
    try:
        return d.version if d is not None else None
    except Exception:  # noqa: BLE001
        return None


def _dists_for_modules(modules) -> list:
    """Distribution names providing the top-level packages of ``modules`` (when metadata says)."""
    from importlib import metadata

    tops = {m.partition(".")[0] for m in modules}
    if not tops:
        return []
    found: list = []
    try:
        mapping = metadata.packages_distributions()  # Python 3.10+
    except Exception:  # noqa: BLE001
        mapping = {}
    for top in sorted(tops):
        for d in mapping.get(top, [top] if _dist(top) is not None else []):
            if d not in found:
                found.append(d)
    return found


def checked_distributions(also_import=()) -> list:
    """lora_otel, the installed packages of the training stack as lora_otel knows it
    (``envfacts.PACKAGES``), and the distributions of the ``--also-import`` modules."""
    from lora_otel._boot.seam import envfacts

    names = ["lora_otel"] + list(dict.fromkeys(list(STACK) + list(envfacts.PACKAGES)))
    names += _dists_for_modules(also_import)
    out: list = []
    seen: set = set()
    for name in names:
        key = _norm(name)
        if key in seen or _dist(name) is None:
            continue
        seen.add(key)
        out.append(name)
    return out


def check_python(dists) -> list:
    """Python against lora_otel's own ``Requires-Python`` (>=3.9) and each distribution's."""
    import platform

    t0 = time.perf_counter()
    here = platform.python_version()
    seen: list = []
    unmet: list = []
    for name in dists:
        d = _dist(name)
        req = None
        if d is not None:
            try:
                req = d.metadata.get("Requires-Python")
            except Exception:  # noqa: BLE001
                req = None
        if name == "lora_otel" and not req:
            req = LORA_OTEL_REQUIRES_PYTHON
        if not req:
            continue
        version = _dist_version(name) or "?"
        seen.append((name, version, req))
        if not _contains(req, here):
            unmet.append((name, version, req))
    if "lora_otel" not in [n for n, _, _ in seen]:  # not installed as a distribution (a source checkout)
        seen.insert(0, ("lora_otel", "?", LORA_OTEL_REQUIRES_PYTHON))
        if not _contains(LORA_OTEL_REQUIRES_PYTHON, here):
            unmet.insert(0, ("lora_otel", "?", LORA_OTEL_REQUIRES_PYTHON))
    details = {
        "python": here,
        "implementation": platform.python_implementation(),
        "requires_python": {n: r for n, _, r in seen},
    }
    dt = time.perf_counter() - t0
    if not unmet:
        own = dict((n, r) for n, _, r in seen).get("lora_otel", LORA_OTEL_REQUIRES_PYTHON)
        others = len(seen) - 1
        return [
            Check(
                "python",
                "ok",
                "Python %s meets Requires-Python of lora_otel (%s)%s"
                % (
                    here,
                    own,
                    " and of %d other installed package%s" % (others, "" if others == 1 else "s") if others else "",
                ),
                duration_s=dt,
                details=details,
            )
        ]
    return [
        Check(
            "python",
            "fail",
            "Python %s is outside %s %s's Requires-Python %s" % (here, name, version, req),
            "use a Python that %s supports (%s), or a %s release that supports Python %s"
            % (name, req, name, ".".join(here.split(".")[:2])),
            duration_s=dt,
            details=details,
        )
        for name, version, req in unmet
    ]


def check_requirements(dists) -> list:
    """Each distribution's declared requirements (markers for this interpreter, no extras) against
    what is installed: a missing one fails, a version outside the range warns (the import lines
    tell whether it breaks anything)."""
    t0 = time.perf_counter()
    env = _marker_env()
    out: list = []
    n_reqs = 0
    checked: list = []
    for name in dists:
        d = _dist(name)
        if d is None:
            continue
        try:
            lines = d.requires or []
            version = d.version
        except Exception as e:  # noqa: BLE001 - a broken METADATA
            out.append(
                Check("requirements", "warn", "cannot read %s's metadata: %s" % (name, e), "reinstall %s" % name)
            )
            continue
        checked.append("%s %s" % (name, version))
        for line in lines:
            req = _requirement(line, env)
            if req is None:
                continue
            n_reqs += 1
            installed = _dist_version(req.name)
            if installed is None:
                out.append(
                    Check(
                        "requirements",
                        "fail",
                        "%s %s requires %s%s, which is not installed" % (name, version, req.name, req.spec),
                        "pip install '%s%s'" % (req.name, req.spec),
                        details={"package": name, "version": version, "requirement": line, "installed": None},
                    )
                )
            elif req.spec and not _contains(req.spec, installed):
                out.append(
                    Check(
                        "requirements",
                        "warn",
                        "%s %s requires %s%s, but %s %s is installed"
                        % (name, version, req.name, req.spec, req.name, installed),
                        "pip install '%s%s', or a %s release that supports %s %s"
                        % (req.name, req.spec, name, req.name, installed),
                        details={"package": name, "version": version, "requirement": line, "installed": installed},
                    )
                )
    dt = time.perf_counter() - t0
    for c in out:
        c.duration_s = round(dt, 3)
    if not out:
        return [
            Check(
                "requirements",
                "ok",
                "%d requirement%s of %d installed package%s met (%s)"
                % (
                    n_reqs,
                    "" if n_reqs == 1 else "s",
                    len(checked),
                    "" if len(checked) == 1 else "s",
                    ", ".join(c.split()[0] for c in checked),
                ),
                duration_s=dt,
                details={"packages": checked, "requirements": n_reqs},
            )
        ]
    return out


# --- CUDA build against the driver ------------------------------------------------------------

# CUDA toolkit → minimum Linux driver (NVIDIA's CUDA release notes, "CUDA Toolkit and Corresponding
# Driver Versions", GA releases). Used only when libcuda cannot be asked (cuDriverGetVersion).
_CUDA_MIN_DRIVER = (
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


def _vtuple(text: str | None) -> tuple:
    out = []
    for part in str(text or "").strip().split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def max_cuda_for_driver(driver: str) -> tuple | None:
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
    result: dict = {}

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


def check_cuda_build(build: dict, driver: dict, driver_cuda: str | None, probe: dict | None = None) -> Check | None:
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


# --- stacks ------------------------------------------------------------------------------------


def _threads(stacks: str) -> list:
    """faulthandler's dump → ``[(header, [(path, line, func), ...innermost first])]``."""
    import re

    frame_re = re.compile(r'\s*File "(.*)", line (\d+) in (.*)')
    threads: list = []
    for line in stacks.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            threads.append((line.strip(), []))
            continue
        m = frame_re.match(line)
        if m and threads:
            threads[-1][1].append((m.group(1), int(m.group(2)), m.group(3).strip()))
    return threads


def stack_excerpt(stacks: str, max_frames: int = 8) -> list:
    """The check process's main thread in a faulthandler dump: ``[(path, line, func, source)]``,
    innermost first, up to the doctor's own frame, without importlib's frozen frames."""
    import linecache

    threads = _threads(stacks)
    pick = None
    for _, frames in threads:
        if any(p.endswith(os.path.join("lora_otel", "export", "doctor.py")) for p, _, _ in frames):
            pick = frames
            break
    if pick is None:
        for _, frames in threads:
            if frames and "lora_otel/_boot/" not in frames[0][0]:
                pick = frames
                break
    out: list = []
    for path, line, func in pick or []:
        if path.endswith(os.path.join("lora_otel", "export", "doctor.py")):
            break
        if path.startswith("<frozen") or "lora_otel/_boot/" in path.replace("\\", "/"):
            continue  # importlib's machinery and lora_otel's import hook
        out.append((path, line, func, linecache.getline(path, line).strip()))
        if len(out) >= max_frames:
            break
    return out


def _frame_text(path: str, line: int, func: str, source: str = "") -> str:
    return "%s:%d in %s%s" % (_short_path(path), line, func, ": " + source if source else "")


def _short_path(path: str) -> str:
    """The last two parts of a path: ``hangpkg/__init__.py``, ``torch/__init__.py``."""
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else path


# --- the parent: following the check process ---------------------------------------------------


class _Step:
    __slots__ = ("began", "kind", "limit", "name")

    def __init__(self, name: str, kind: str, limit: float) -> None:
        self.name, self.kind, self.limit, self.began = name, kind, limit, time.monotonic()


class _Run:
    """What the check process said, and how it ended."""

    def __init__(self) -> None:
        self.hello: dict = {}
        self.results: dict = {}  # step name -> end message
        self.order: list = []  # step names in the order they began
        self.hung: dict | None = None  # {"step", "kind", "limit", "waited", "evidence", "excerpt", ...}
        self.died: dict | None = None  # {"step", "status", "log_tail"}
        self.done = False
        self.exit_hung: dict | None = None
        self.returncode: int | None = None
        self.pid: int | None = None


def _timeout_for(step: str, kind: str, limits: dict, import_limits: dict) -> float:
    if kind == "import":
        module = step[len("import ") :] if step.startswith("import ") else step
        for key in (module, module.partition(".")[0]):
            if key in import_limits:
                return import_limits[key]
    return limits.get(kind, limits["import"])


def _log_tail(path: str | None, n: int = 20) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("[lora-otel]")]
    return "\n".join(lines[-n:])


def _describe_status(rc: int) -> str:
    from lora_otel.cli.run import describe_status

    return describe_status(rc)


def _append_exit(journal: str | None, rc: int, why: str | None) -> bool:
    """Append the ``exit`` record the check process could not write (docs/journal.md), once."""
    from lora_otel.cli.run import record_exit

    return record_exit(journal, rc, "lora-otel doctor: %s" % why if why else None, by="lora-otel doctor", hint="")


def _kill_group(proc) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        try:
            proc.kill()
        except OSError:
            pass


def _gather(pid: int, stacks_path: str | None) -> dict:
    """Evidence about the check process (lora_otel's own child: its stack handler is the preamble's,
    or the one the check script registers on the same signal)."""
    from lora_otel._boot.seam import stack_signal
    from lora_otel.analysis import evidence

    try:
        signum = stack_signal()
        request = evidence.StackRequest(signum, stacks_path) if stacks_path and signum else None
        return evidence.gather(pid, request)
    except Exception as e:  # noqa: BLE001 - evidence is best effort
        return {evidence.PREFIX + "error": "%s: %s" % (type(e).__name__, e)}


def _diagnosis(step: _Step, ev: dict, journal: str | None) -> str:
    """diagnose's sentence when it says something specific (network, CUDA init, frozen), else ""."""
    try:
        from lora_otel.analysis.diagnose import explain
        from lora_otel.analysis.stall import Stall
        from lora_otel.journal.reader import Span, read_journal
        from lora_otel.journal.tree import deepest_open_span

        j = None
        span = None
        if journal and os.path.exists(journal):
            j = read_journal(journal)
            span = deepest_open_span(j)
        if span is None:
            span = Span(
                name=step.name, span_id="0" * 15 + "1", parent_id=None, trace_id="0" * 31 + "1", start_ns=time.time_ns()
            )
        waited = time.monotonic() - step.began
        sentence = explain(Stall("alive", span, waited, step.limit, ""), ev, j).sentence
        return "" if sentence.startswith("Cannot tell") else sentence
    except Exception:  # noqa: BLE001
        return ""


def _follow(
    proc, rfd: int, journal: str | None, log_path: str | None, fallback_stacks: str, limits: dict, import_limits: dict
) -> _Run:
    """Read the check process's messages until it exits; kill it when a step passes its limit."""
    import json
    import selectors

    run = _Run()
    run.pid = proc.pid
    sel = selectors.DefaultSelector()
    sel.register(rfd, selectors.EVENT_READ)
    buf = b""
    current = _Step("start-up", "import", _timeout_for("start-up", "import", limits, import_limits))
    eof = False
    try:
        while True:
            now = time.monotonic()
            left = current.began + current.limit - now
            if left <= 0:
                _on_hang(run, proc, current, journal, fallback_stacks)
                break
            if not eof:
                for _key, _mask in sel.select(timeout=min(left, 0.25)):
                    try:
                        data = os.read(rfd, 65536)
                    except OSError:
                        data = b""
                    if not data:
                        eof = True
                        sel.unregister(rfd)
                        break
                    buf += data
            else:
                time.sleep(min(left, 0.05))
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(raw.decode("utf-8", "replace"))
                except ValueError:
                    continue
                current = _on_message(run, msg, current, limits, import_limits)
            rc = proc.poll()
            if rc is not None and (eof or not buf):
                if not eof:  # whatever is still in the pipe
                    try:
                        while True:
                            data = os.read(rfd, 65536)
                            if not data:
                                break
                            buf += data
                    except OSError:
                        pass
                    for raw in buf.split(b"\n"):
                        try:
                            current = _on_message(
                                run, json.loads(raw.decode("utf-8", "replace")), current, limits, import_limits
                            )
                        except ValueError:
                            pass
                run.returncode = rc
                if not run.done:
                    run.died = {
                        "step": current.name,
                        "kind": current.kind,
                        "status": _describe_status(rc),
                        "log_tail": _log_tail(log_path),
                    }
                break
    finally:
        sel.close()
        if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM) or an error here: leave nothing behind
            _kill_group(proc)
            proc.wait()
            _append_exit(journal, proc.returncode, "lora-otel doctor was interrupted")
    if run.returncode is None:
        run.returncode = proc.returncode
    if (run.returncode is not None and run.returncode < 0) or run.hung or run.exit_hung:
        why = None
        if run.hung:
            why = "%s passed its %s limit" % (run.hung["step"], _limit(run.hung["limit"]))
        elif run.exit_hung:
            why = "no exit %s after the last check" % _limit(EXIT_LIMIT_S)
        _append_exit(journal, run.returncode if run.returncode is not None else -9, why)
    return run


def _on_message(run: _Run, msg: dict, current: _Step, limits: dict, import_limits: dict) -> _Step:
    ev = msg.get("ev")
    if ev == "hello":
        run.hello = msg
        return _Step("after start-up", "import", max(limits.values()))
    if ev == "begin":
        name = str(msg.get("step"))
        kind = str(msg.get("kind") or "import")
        run.order.append(name)
        return _Step(name, kind, _timeout_for(name, kind, limits, import_limits))
    if ev == "end":
        name = str(msg.get("step"))
        run.results[name] = msg
        return _Step("after " + name, current.kind, max(limits.values()))
    if ev == "done":
        run.done = True
        return _Step("exit", "exit", EXIT_LIMIT_S)
    return current


def _on_hang(run: _Run, proc, step: _Step, journal: str | None, fallback_stacks: str) -> None:
    from lora_otel.analysis.evidence import PREFIX

    stacks_path = run.hello.get("stacks") or (fallback_stacks if os.path.exists(fallback_stacks) else None)
    if not run.hello and journal and not os.path.exists(journal):
        stacks_path = None  # no preamble, no handler: the stack request signal would only kill it
    waited = time.monotonic() - step.began
    ev = _gather(proc.pid, stacks_path)
    stacks = str(ev.get(PREFIX + "python.stacks") or ev.get(PREFIX + "py_spy.dump") or "")
    info = {
        "step": step.name,
        "kind": step.kind,
        "limit": step.limit,
        "waited": round(waited, 1),
        "evidence": {k[len(PREFIX) :] if k.startswith(PREFIX) else k: v for k, v in ev.items()},
        "stacks": stacks,
        "excerpt": stack_excerpt(stacks),
        "diagnosis": _diagnosis(step, ev, journal),
        "pid": proc.pid,
    }
    _kill_group(proc)
    try:
        proc.wait(timeout=30)
    except Exception:  # noqa: BLE001 - SIGKILL cannot be ignored; a D-state process may linger
        pass
    info["killed"] = proc.poll() is not None
    if step.kind == "exit":
        run.exit_hung = info
    else:
        run.hung = info


# --- turning what happened into checks ---------------------------------------------------------

_HANG_ADVICE = {
    "import": "find what %s waits for in the stack (a lock, the network, a GPU, a slow file system); if it "
    "is only slow, raise --import-timeout",
    "cuda": "CUDA initialisation hung: look at nvidia-smi and the kernel log (dmesg: Xid errors), check "
    "CUDA_VISIBLE_DEVICES; raise --cuda-timeout if the machine is only slow",
    "gpu": "the GPU did not finish a %dx%d matmul: look at nvidia-smi for a busy or faulty device and dmesg "
    "for Xid errors; raise --gpu-timeout if it is only slow" % (MATMUL_N, MATMUL_N),
    "lora": "the LoRA forward/backward did not finish: see the stack; raise --lora-timeout if it is only slow",
    "exit": "something the check process loaded blocks interpreter exit (an atexit handler or a non-daemon "
    "thread): see the stack",
}


def _hang_check(h: dict, name: str | None = None) -> Check:
    ev = h["evidence"]
    parts = ["no result after %s (limit %s)" % (_secs(h["waited"]), _limit(h["limit"]))]
    if h["excerpt"]:
        parts.append("stuck at %s" % _frame_text(*h["excerpt"][0]))
    elif ev.get("python.stacks.error"):
        parts.append("no Python stack: %s" % ev["python.stacks.error"])
    if h["diagnosis"]:
        parts.append(h["diagnosis"].rstrip("."))
    state = ev.get("process.state")
    if state:
        text = "process %s" % str(state).split(" ", 1)[-1].strip("()")
        wchan = ev.get("process.wait_channel")
        if wchan and not str(wchan).startswith("(none"):
            text += " (wait channel %s)" % wchan
        cpu = ev.get("process.cpu_percent")
        if isinstance(cpu, (int, float)):
            text += ", %.0f%% CPU" % cpu
        parts.append(text)
    parts.append("check process (pid %d) %s" % (h["pid"], "killed" if h.get("killed") else "could not be killed"))
    step = h["step"]
    advice = _HANG_ADVICE.get(h["kind"], "see the stack")
    if step == "start-up":
        advice = (
            "the interpreter's start hangs before the first check (sitecustomize, a .pth file, "
            "lora_otel's preamble): see the stack; raise --import-timeout if it is only slow"
        )
    elif step.startswith("after ") or step == "after start-up":
        advice = "the check process hung between two steps, in lora-otel doctor itself: see the stack, and report it"
    elif "%s" in advice:
        advice = advice % step[len("import ") :]
    status = "warn" if h["kind"] == "exit" else "fail"
    return Check(
        name or step,
        status,
        "hung: " + "; ".join(parts),
        advice,
        duration_s=h["waited"],
        details={
            "pid": h["pid"],
            "limit_s": h["limit"],
            "killed": h.get("killed"),
            "stack": [{"file": p, "line": n, "function": f, "source": s} for p, n, f, s in h["excerpt"]],
            "stacks": h["stacks"],
            "diagnosis": h["diagnosis"],
            "evidence": h["evidence"],
        },
    )


def _died_check(d: dict, name: str) -> Check:
    tail = d.get("log_tail") or ""
    last = tail.splitlines()[-1] if tail else ""
    evidence = "the check process died: %s%s" % (d["status"], "; last output: %s" % last if last else "")
    if d["status"].startswith("cannot start"):
        advice = "check that this Python (%s) can start programs" % sys.executable
    elif name.startswith("import "):
        advice = (
            "a crash in native code (a C extension, a CUDA library): run it alone to see the native stack, "
            "python -X faulthandler -c 'import %s'; the check process's log has the output" % name[7:]
        )
    else:
        advice = (
            "a crash in native code (the driver, a CUDA library): see the check process's log for the "
            "faulthandler stack, and dmesg for driver errors"
        )
    return Check(name, "fail", evidence, advice, details={"status": d["status"], "log_tail": tail})


def _import_advice(module: str, msg: dict) -> str:
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


def _import_check(name: str, msg: dict, failed_before=()) -> Check:
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


def _gpu_check(name: str, msg: dict) -> Check:
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


def _lora_check(msg: dict) -> Check:
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


def _cuda_runtime_checks(run: _Run, static: Check | None, need: int | None) -> list:
    """The ``cuda`` line (static build vs driver, with what the probe saw), ``cuda init``, the GPUs,
    ``gpu memory``."""
    out: list = []
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


def _memory_check(need: int, probe: dict | None, init: dict | None, gpus: list, static: Check | None) -> Check:
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


def _journal_check(journal: str | None, run: _Run) -> Check:
    from lora_otel.journal.reader import JournalError, read_journal

    actual = run.hello.get("journal") or journal
    if not run.hello.get("traced") and not (actual and os.path.exists(actual)):
        return Check(
            "journal",
            "warn",
            "the check process was not traced: no journal at %s" % journal,
            "is lora_otel installed in this Python (%s)? its .pth hook activates LORA_OTEL=1" % sys.executable,
            details={"path": journal},
        )
    try:
        j = read_journal(actual)
    except JournalError as e:
        return Check("journal", "warn", "cannot read the journal: %s" % e, None, details={"path": actual})
    imports = [s for s in j.spans if s.name.startswith("import ")]
    text = "%s: %d spans (%d imports)" % (_rel(actual), len(j.spans), len(imports))
    details = {"path": actual, "spans": len(j.spans), "imports": [s.name for s in imports], "problems": j.problems}
    root = j.root.attrs if j.root is not None else {}
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint:
        from lora_otel._boot.seam import redact_value

        endpoint = redact_value(endpoint)  # no user-info, no secret query parameters in a report
    errors = [ln.msg for ln in j.lines if ln.level == "error" and "live export" in ln.msg]
    if root.get("lora_otel.sidecar.pid"):
        text += "; exported live to %s by sidecar pid %s (log: %s)" % (
            endpoint or "the configured endpoint",
            root["lora_otel.sidecar.pid"],
            _rel(str(root.get("lora_otel.sidecar.log") or "?")),
        )
        details["sidecar_pid"] = root["lora_otel.sidecar.pid"]
    elif errors:
        return Check(
            "journal",
            "warn",
            text + "; " + errors[-1],
            "see docs/journal.md; the journal can be sent later with lora-otel replay %s" % _rel(actual),
            details=details,
        )
    elif endpoint:
        text += "; no live export although %s is set" % endpoint
        return Check(
            "journal",
            "warn",
            text,
            "see the check process's log %s" % _rel(run.hello.get("log") or ""),
            details=details,
        )
    else:
        text += "; no OTLP endpoint set (lora-otel replay sends it later)"
    if j.problems:
        return Check(
            "journal",
            "warn",
            text
            + "; %d problem%s reading it: %s" % (len(j.problems), "" if len(j.problems) == 1 else "s", j.problems[0]),
            None,
            details=details,
        )
    return Check("journal", "ok", text, details=details)


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


# --- the parent: the whole run -----------------------------------------------------------------


def _installed(name: str) -> bool:
    """Whether a top-level module can be found (its finder only: nothing of it runs)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _journal_path(args) -> str:
    from lora_otel._boot.seam import paths

    base = getattr(args, "dir", None) or os.environ.get("LORA_OTEL_DIR") or os.path.join(os.getcwd(), "lora-otel")
    path = os.path.join(os.path.abspath(base), "doctor-" + paths.journal_name(os.getpid(), time.time()))
    return path


def _child_env(journal: str, wfd: int) -> dict:
    env = dict(os.environ)
    env["LORA_OTEL"] = "1"
    env.pop("LORA_OTEL_SIDECAR", None)
    env["LORA_OTEL_JOURNAL"] = journal
    env["LORA_OTEL_JOURNAL_OWNER"] = str(os.getpid())
    env.setdefault("OTEL_SERVICE_NAME", "lora-otel-doctor")
    env[_PROTO_ENV] = str(wfd)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash writes its stack to the log
    return env


def doctor(args) -> dict:
    """Run every check; the report as the ``--json`` object (docs/doctor.md)."""
    import subprocess

    from lora_otel import __version__
    from lora_otel._boot import envfacts, paths, preamble
    from lora_otel.cli.run import die_with_parent

    started = time.monotonic()
    also = list(getattr(args, "also_import", None) or [])
    limits = dict(DEFAULT_TIMEOUTS)
    import_limits: dict = {}
    for name, seconds in getattr(args, "import_timeout", None) or []:
        if name is None:
            limits["import"] = seconds
        else:
            import_limits[name] = seconds
    for kind in ("cuda", "gpu", "lora"):
        value = getattr(args, "%s_timeout" % kind, None)
        if value is not None:
            limits[kind] = value
    need = getattr(args, "need_gpu_memory", None)

    plan = [m for m in STACK if _installed(m)]
    not_installed = [m for m in STACK if m not in plan]
    imports = plan + [m for m in also if m not in plan]
    lora = "peft" in plan and "torch" in plan

    journal = _journal_path(args)
    log_path = paths.stem(journal) + ".log"
    fallback_stacks = preamble.stacks_path(journal)
    try:
        os.makedirs(os.path.dirname(journal), mode=0o700, exist_ok=True)
        log = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
    except OSError:
        import tempfile

        log = tempfile.NamedTemporaryFile(prefix="lora-otel-doctor-", suffix=".log", delete=False)
        log_path = log.name
    argv = [sys.executable, "-c", _CHILD_CODE, "--child", "--stacks", fallback_stacks, "--output", log_path]
    for m in imports:
        argv += ["--import", m]
    if lora:
        argv.append("--lora")
    if "torch" not in plan and "torch" not in also:
        argv.append("--no-cuda")
    rfd, wfd = os.pipe()
    checks: list = []
    static_cuda = None
    proc = None
    try:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=_child_env(journal, wfd),
                pass_fds=(wfd,),
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        except OSError as e:
            run = _Run()
            run.died = {
                "step": "start-up",
                "kind": "import",
                "status": "cannot start %s: %s" % (sys.executable, e.strerror or e),
                "log_tail": "",
            }
        finally:
            os.close(wfd)
            log.close()
        # While the check process starts (seconds), the checks that need nothing imported.
        try:
            dists = checked_distributions(also)
            checks += check_python(dists)
            checks += check_requirements(dists)
        except Exception as e:  # noqa: BLE001 - a broken metadata store must not stop the flow's report
            checks.append(
                Check(
                    "requirements",
                    "warn",
                    "cannot read the installed packages' metadata: %s: %s" % (type(e).__name__, e),
                    "reinstall the package named in the error",
                )
            )
        build = envfacts.torch_build()
        drv_facts = envfacts.driver_facts()
        driver_cuda = driver_cuda_version() if drv_facts.get("nvidia.driver_version") else None
        static_cuda = check_cuda_build(build, drv_facts, driver_cuda)
        if proc is not None:
            run = _follow(proc, rfd, journal, log_path, fallback_stacks, limits, import_limits)
    finally:
        os.close(rfd)
        if proc is not None and proc.poll() is None:  # interrupted before or while following it
            _kill_group(proc)
            proc.wait()

    # The imports, in plan order.
    stopped_at = (run.hung or run.died or {}).get("step")
    failed: list = []
    for m in imports:
        name = "import " + m
        if name in run.results:
            checks.append(_import_check(name, run.results[name], failed))
            if run.results[name].get("status") != "ok":
                failed.append(m)
        elif run.hung and run.hung["step"] == name:
            checks.append(_hang_check(run.hung))
        elif run.died and run.died["step"] == name:
            checks.append(_died_check(run.died, name))
    if "torch" not in plan and "torch" not in also:
        checks.append(
            Check(
                "import torch",
                "fail",
                "torch is not installed",
                "pip install torch (a CUDA build for GPU training: https://pytorch.org/get-started/locally/)",
            )
        )
    checks += _cuda_runtime_checks(run, static_cuda, need)
    for step, kind in (("cuda probe", "cuda"), ("cuda init", "cuda")):
        if run.hung and run.hung["step"] == step:
            checks.append(_hang_check(run.hung, step))
        elif run.died and run.died["step"] == step:
            checks.append(_died_check(run.died, step))
    if run.hung and run.hung["kind"] == "gpu":
        checks.append(_hang_check(run.hung))
    elif run.died and run.died["kind"] == "gpu":
        checks.append(_died_check(run.died, run.died["step"]))
    if "lora" in run.results:
        checks.append(_lora_check(run.results["lora"]))
    elif run.hung and run.hung["step"] == "lora":
        checks.append(_hang_check(run.hung, "lora"))
    elif run.died and run.died["step"] == "lora":
        checks.append(_died_check(run.died, "lora"))
    handled = {c.name for c in checks}
    if run.hung and run.hung["step"] not in handled and run.hung["kind"] != "exit":
        checks.append(_hang_check(run.hung))  # start-up, or between steps
    if run.died and run.died["step"] not in handled:
        checks.append(_died_check(run.died, run.died["step"]))
    if run.exit_hung:
        checks.append(_hang_check(run.exit_hung, "exit"))
    elif run.done and run.returncode not in (0, None):
        checks.append(
            Check(
                "exit",
                "warn",
                "the check process finished its checks but exited with %s" % _describe_status(run.returncode),
                "see its log %s" % _rel(log_path),
                details={"log_tail": _log_tail(log_path)},
            )
        )
    left = [("import " + m) for m in imports if "import " + m not in run.results and "import " + m != stopped_at]
    if "torch" in imports and "cuda probe" not in run.results and stopped_at not in ("cuda probe", "cuda init"):
        left.append("cuda")
    if lora and "lora" not in run.results and stopped_at != "lora":
        left.append("lora")
    if left:
        if stopped_at and not run.done:
            why, first = "the check process was stopped at %s" % stopped_at, stopped_at
        else:
            failed = [n for n in ("import torch", "import peft") if (run.results.get(n) or {}).get("status") == "error"]
            why = "%s failed" % " and ".join(failed) if failed else "skipped"
            first = failed[0] if failed else "the failures above"
        checks.append(
            Check(
                "not run",
                "warn",
                "%s: %s" % (", ".join(left), why),
                "fix %s first, then run lora-otel doctor again" % first,
                details={"steps": left},
            )
        )
    checks.append(_journal_check(journal, run))
    counts = {s: sum(1 for c in checks if c.status == s) for s in ("ok", "warn", "fail")}
    status = "fail" if counts["fail"] else "warn" if counts["warn"] else "ok"
    actual_journal = run.hello.get("journal") or (journal if os.path.exists(journal) else None)
    return {
        "lora_otel_version": __version__,
        "status": status,
        "exit_code": 1 if counts["fail"] else 0,
        "counts": counts,
        "duration_s": round(time.monotonic() - started, 3),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "journal": actual_journal,
        "log": log_path,
        "pid": run.pid,
        "not_installed": not_installed,
        "timeouts_s": {**limits, **{"import " + k: v for k, v in import_limits.items()}},
        "need_gpu_memory": need,
        "checks": [c.to_dict() for c in checks],
    }


def render_text(report: dict) -> str:
    """One line per check: ``ok    import torch            2.13.0+cpu in 1.3 s``, then a summary."""
    checks = report["checks"]
    width = max([len(c["name"]) for c in checks] + [20]) + 2
    lines = []
    for c in checks:
        text = "%-6s%-*s%s" % (c["status"], width, c["name"], c["evidence"])
        if c["advice"] and c["status"] != "ok":
            text += " \u2014 " + c["advice"]
        lines.append(text)
        for frame in (c.get("details") or {}).get("stack") or []:
            lines.append(
                "%s%s" % (" " * 8, _frame_text(frame["file"], frame["line"], frame["function"], frame["source"]))
            )
    if report.get("not_installed"):
        lines.append("not installed (not checked): %s" % ", ".join(report["not_installed"]))
    n = report["counts"]
    lines.append(
        "doctor: %d ok, %d warn, %d fail in %s; journal: %s"
        % (
            n["ok"],
            n["warn"],
            n["fail"],
            _secs(report["duration_s"]),
            _rel(report["journal"]) if report.get("journal") else "none",
        )
    )
    return "\n".join(lines) + "\n"


def run_doctor(args) -> int:
    """``lora-otel doctor``: print the report, return 0 (no fail) or 1."""
    import json
    import signal
    import threading

    def terminated(signum, _frame):
        raise SystemExit(128 + signum)  # unwinds through the cleanup that kills the check process

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, terminated)
    try:
        report = doctor(args)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(report))
    sys.stdout.flush()
    return int(report["exit_code"])


# --- arguments ---------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number of seconds" % text) from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError("%r must be more than 0 seconds" % text)
    return value


def _import_timeout(text: str) -> tuple:
    name, eq, value = text.rpartition("=")
    if not eq:
        return None, _seconds(text)
    import argparse

    name = name.strip()
    if not _is_module_name(name):
        raise argparse.ArgumentTypeError("%r: %r is not a module name (use SECONDS or MODULE=SECONDS)" % (text, name))
    return name, _seconds(value)


def _is_module_name(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def _module(text: str) -> str:
    import argparse

    if not _is_module_name(text.strip()):
        raise argparse.ArgumentTypeError("%r is not a module name (e.g. mytrain or mytrain.data)" % text)
    return text.strip()


def _size(text: str) -> int:
    import argparse

    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError("%r must be more than 0 bytes" % text)
    return value


def add_arguments(p) -> None:
    """The options of ``lora-otel doctor`` (cli.py builds the subcommand)."""
    p.add_argument("--json", action="store_true", help="print the report as JSON (docs/doctor.md)")
    p.add_argument(
        "--dir", help="directory for the check process's journal (default: $LORA_OTEL_DIR, else ./lora-otel/)"
    )
    p.add_argument(
        "--need-gpu-memory",
        type=_size,
        metavar="SIZE",
        help="fail unless every visible GPU has this much free memory (16G, 80GB, 512M)",
    )
    p.add_argument(
        "--also-import",
        action="append",
        type=_module,
        metavar="MODULE",
        default=[],
        help="also import this module, after the training stack, with the same checks (repeatable)",
    )
    p.add_argument(
        "--import-timeout",
        action="append",
        type=_import_timeout,
        metavar="[MODULE=]S",
        default=[],
        help="seconds an import may take before it counts as hung (default 120); MODULE=S for one module (repeatable)",
    )
    p.add_argument(
        "--cuda-timeout",
        type=_seconds,
        metavar="S",
        help="seconds for the CUDA probe and for CUDA initialisation, each (default 120)",
    )
    p.add_argument("--gpu-timeout", type=_seconds, metavar="S", help="seconds for the matmul on each GPU (default 60)")
    p.add_argument(
        "--lora-timeout", type=_seconds, metavar="S", help="seconds for the LoRA forward and backward (default 120)"
    )


# --- the check process ----------------------------------------------------------------------------


def _child_main(argv: list) -> int:
    """The check process: parse argv by hand (argparse would be an import of its own), then the flow."""
    imports: list = []
    lora = False
    cuda = True
    stacks = None
    log = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--import" and i + 1 < len(argv):
            imports.append(argv[i + 1])
            i += 1
        elif a == "--stacks" and i + 1 < len(argv):
            stacks = argv[i + 1]
            i += 1
        elif a == "--output" and i + 1 < len(argv):
            log = argv[i + 1]
            i += 1
        elif a == "--lora":
            lora = True
        elif a == "--no-cuda":
            cuda = False
        i += 1
    fd_text = os.environ.pop(_PROTO_ENV, "")
    fd = int(fd_text) if fd_text.isdigit() else 1
    if fd != 1:
        try:
            os.set_inheritable(fd, False)  # not into the sidecar or any subprocess
        except OSError:
            fd = 1
    from lora_otel._boot import core, jsonl

    def emit(**msg) -> None:
        data = jsonl.dumps_line(msg)
        try:
            while data:
                n = os.write(fd, data)
                data = data[n:]
        except OSError:
            pass

    if core.active and core.find_open("arguments") is not None:
        import lora_otel

        lora_otel.mark("arguments parsed")  # ends the `arguments` span: nothing more to wait for
    traced = bool(core.active and core.journal_path)
    if traced:
        from lora_otel._boot import preamble

        stacks_path = preamble.stacks_path(core.journal_path)
    else:
        stacks_path = stacks
        if stacks_path:
            try:  # untraced (no .pth hook): stacks on demand all the same
                faulthandler = _quiet_import("faulthandler")
                from lora_otel._boot.seam import stack_signal

                f = os.fdopen(os.open(stacks_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
                faulthandler.register(stack_signal(), file=f, all_threads=True, chain=False)
                _KEEP.append(f)
            except Exception:  # noqa: BLE001
                stacks_path = None
    emit(
        ev="hello",
        pid=os.getpid(),
        traced=traced,
        journal=core.journal_path if traced else None,
        stacks=stacks_path,
        log=log,
        python=sys.version.split()[0],
    )

    ok: dict = {}
    for name in imports:
        ok[name] = _child_import(emit, name)
    torch = sys.modules.get("torch") if ok.get("torch") else None
    gpu0 = False
    if torch is not None and cuda:
        gpu0 = _child_cuda(emit, torch)
    if lora and torch is not None and ok.get("peft"):
        _child_lora(emit, torch, gpu0, bool(ok.get("transformers")))
    emit(ev="done")
    return 0


_KEEP: list = []


def _quiet_import(name: str):
    """Import infrastructure as lora_otel does (untraced), not as the program."""
    __import__(name, _QUIET, None, (), 0)
    return sys.modules[name]


def _error_fields(e: BaseException) -> dict:
    tb = e.__traceback__
    frames: list = []
    while tb is not None:
        code = tb.tb_frame.f_code
        path = code.co_filename
        if not path.startswith("<frozen") and not path.endswith(os.path.join("export", "doctor.py")):
            frames.append([path, tb.tb_lineno, code.co_name])
        tb = tb.tb_next
    text = None
    try:
        traceback = _quiet_import("traceback")
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-8000:]
    except Exception:  # noqa: BLE001
        pass
    message = str(e)
    if len(message) > 500:
        message = message[:500] + "..."
    chained: list = []  # the files of the exceptions this one was raised from (``raise ... from e``)
    cause, seen = e.__cause__ or e.__context__, 0
    while cause is not None and seen < 5:
        tb = cause.__traceback__
        while tb is not None:
            path = tb.tb_frame.f_code.co_filename
            if not path.startswith("<frozen") and path not in chained:
                chained.append(path)
            tb = tb.tb_next
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return {
        "status": "error",
        "error": "%s: %s" % (type(e).__name__, message),
        "error_type": type(e).__name__,
        "frames": frames[-6:],
        "chained_files": chained[-20:],
        "traceback": text,
    }


def _child_import(emit, name: str) -> bool:
    step = "import " + name
    emit(ev="begin", step=step, kind="import")
    t0 = time.perf_counter()
    try:
        __import__(name, _PROGRAM, None, (), 0)  # the import hook makes this the span `import NAME`
        mod = sys.modules[name]
    except (Exception, SystemExit) as e:
        fields = _error_fields(e)
        if isinstance(e, ModuleNotFoundError):
            fields["missing"] = e.name
        emit(ev="end", step=step, duration_s=time.perf_counter() - t0, **fields)
        return False
    dt = time.perf_counter() - t0
    version = getattr(mod, "__version__", None)
    if not isinstance(version, str):
        try:
            from lora_otel._boot.seam import envfacts

            version = envfacts.package_version(name.partition(".")[0])
        except Exception:  # noqa: BLE001
            version = None
    emit(ev="end", step=step, status="ok", duration_s=dt, version=version, file=getattr(mod, "__file__", None))
    return True


def _child_cuda(emit, torch) -> bool:
    """Probe, initialise, then a matmul on every visible GPU. True when GPU 0 works."""
    emit(ev="begin", step="cuda probe", kind="cuda")
    t0 = time.perf_counter()
    try:
        available = bool(torch.cuda.is_available())  # the `cuda probe` span
    except Exception as e:  # noqa: BLE001
        emit(ev="end", step="cuda probe", duration_s=time.perf_counter() - t0, **_error_fields(e))
        return False
    reason = None
    if not available:
        try:
            from lora_otel._boot import torch_hooks

            reason = torch_hooks._cuda_absent_reason(torch)
        except Exception:  # noqa: BLE001
            reason = None
    emit(
        ev="end",
        step="cuda probe",
        status="ok",
        available=available,
        reason=reason,
        duration_s=time.perf_counter() - t0,
    )
    if not available:
        return False
    emit(ev="begin", step="cuda init", kind="cuda")
    t0 = time.perf_counter()
    try:
        torch.cuda.init()  # the `cuda init` span
        n = torch.cuda.device_count()
        names = [str(torch.cuda.get_device_name(i)) for i in range(n)]
    except Exception as e:  # noqa: BLE001
        emit(ev="end", step="cuda init", duration_s=time.perf_counter() - t0, **_error_fields(e))
        return False
    emit(
        ev="end", step="cuda init", status="ok", device_count=n, device_names=names, duration_s=time.perf_counter() - t0
    )
    try:
        arch_list = [str(a) for a in torch.cuda.get_arch_list()]
    except Exception:  # noqa: BLE001
        arch_list = []
    ok0 = False
    for i in range(n):
        ok = _child_gpu(emit, torch, i, arch_list)
        if i == 0:
            ok0 = ok
    return ok0


def arch_supported(capability: tuple, arch_list) -> bool:
    """Whether torch's ``get_arch_list()`` has kernels for a GPU of this compute capability: a cubin
    of the same major and an equal or lower minor (``sm_80`` runs on 8.6), or PTX of an equal or
    lower capability (``compute_90``, compiled by the driver at first use)."""
    for arch in arch_list:
        kind, _, number = str(arch).partition("_")
        digits = "".join(ch for ch in number if ch.isdigit())
        if not digits or kind not in ("sm", "compute"):
            continue
        cap = (int(digits) // 10, int(digits) % 10)
        suffixed = number != digits  # sm_90a: for exactly that capability
        if kind == "sm" and (
            cap == capability or (not suffixed and cap[0] == capability[0] and cap[1] <= capability[1])
        ):
            return True
        if kind == "compute" and not suffixed and cap <= capability:
            return True
    return False


def _child_gpu(emit, torch, i: int, arch_list: list) -> bool:
    import lora_otel

    step = "gpu %d" % i
    emit(ev="begin", step=step, kind="gpu")
    t0 = time.perf_counter()
    facts: dict = {"index": i}
    try:
        props = torch.cuda.get_device_properties(i)
        facts["device_name"] = str(props.name)
        facts["capability"] = "%d.%d" % (props.major, props.minor)
        facts["arch_list"] = arch_list
        facts["arch_ok"] = arch_supported((props.major, props.minor), arch_list) if arch_list else None
        free, total = torch.cuda.mem_get_info(i)
        facts["free"], facts["total"] = int(free), int(total)
        with lora_otel.stage("gpu %d matmul" % i, device=facts["device_name"]):
            g = torch.Generator().manual_seed(i)
            a = torch.randn(MATMUL_N, MATMUL_N, generator=g)
            dev = torch.device("cuda", i)
            t1 = time.perf_counter()
            x = a.to(dev)
            y = x @ x
            torch.cuda.synchronize(dev)
            back = y.cpu()
            facts["matmul_s"] = time.perf_counter() - t1
            ref = a @ a
            err = float(((back - ref).abs().max() / ref.abs().max()).item())
            finite = bool(torch.isfinite(back).all().item())
            del x, y
            torch.cuda.empty_cache()
        facts["max_rel_error"] = err
        if not finite or err > 1e-2:
            emit(
                ev="end",
                step=step,
                status="error",
                duration_s=time.perf_counter() - t0,
                error="wrong result read back: %s"
                % ("not finite" if not finite else "max relative error %.3g against the CPU" % err),
                **facts,
            )
            return False
    except Exception as e:  # noqa: BLE001
        emit(ev="end", step=step, duration_s=time.perf_counter() - t0, **{**facts, **_error_fields(e)})
        return False
    emit(ev="end", step=step, status="ok", duration_s=time.perf_counter() - t0, **facts)
    return True


def _child_lora(emit, torch, on_gpu: bool, with_transformers: bool) -> None:
    import lora_otel

    emit(ev="begin", step="lora", kind="lora")
    t0 = time.perf_counter()
    device = "cuda:0" if on_gpu else "cpu"
    facts: dict = {"device": device}
    try:
        peft = sys.modules["peft"]
        facts["peft"] = getattr(peft, "__version__", None)
        torch.manual_seed(0)
        if with_transformers:
            facts["model"] = "LlamaForCausalLM"
        else:
            facts["model"] = "MLP"
        with lora_otel.stage("lora forward+backward", model=facts["model"], device=device):
            if with_transformers:
                transformers = sys.modules["transformers"]
                config = transformers.LlamaConfig(
                    vocab_size=128,
                    hidden_size=32,
                    intermediate_size=64,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    num_key_value_heads=2,
                    max_position_embeddings=64,
                )
                model = transformers.LlamaForCausalLM(config)
                targets = ["q_proj", "v_proj"]
            else:
                nn = torch.nn
                model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
                targets = ["0", "2"]
            config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets)
            model = peft.get_peft_model(model, config).to(device)
            t1 = time.perf_counter()
            if with_transformers:
                ids = torch.randint(0, 128, (2, 16), device=device)
                loss = model(input_ids=ids, labels=ids).loss
            else:
                x = torch.randn(4, 16, device=device)
                loss = model(x).pow(2).mean()
            loss.backward()
            if on_gpu:
                torch.cuda.synchronize()
            facts["compute_s"] = time.perf_counter() - t1
            facts["loss"] = float(loss.item())
            lora_params = [(n, p) for n, p in model.named_parameters() if "lora_" in n]
            facts["lora_tensors"] = len(lora_params)
            facts["lora_tensors_with_grad"] = sum(
                1 for _, p in lora_params if p.grad is not None and bool(torch.isfinite(p.grad).all().item())
            )
            facts["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
            facts["total"] = sum(p.numel() for p in model.parameters())
            base_grads = [n for n, p in model.named_parameters() if "lora_" not in n and p.grad is not None]
        problems = []
        if not facts["loss"] == facts["loss"] or facts["loss"] in (float("inf"), float("-inf")):
            problems.append("the loss is not finite")
        if not lora_params:
            problems.append("no LoRA parameters were added")
        elif facts["lora_tensors_with_grad"] == 0:
            problems.append("no LoRA parameter got a finite gradient")
        if base_grads:
            problems.append("base weights got gradients (%s)" % ", ".join(base_grads[:3]))
        if problems:
            emit(
                ev="end",
                step="lora",
                status="error",
                error="; ".join(problems),
                duration_s=time.perf_counter() - t0,
                **facts,
            )
            return
    except Exception as e:  # noqa: BLE001
        emit(ev="end", step="lora", duration_s=time.perf_counter() - t0, **{**facts, **_error_fields(e)})
        return
    emit(ev="end", step="lora", status="ok", duration_s=time.perf_counter() - t0, **facts)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_child_main(sys.argv[2:]))
    sys.stderr.write("this module is lora-otel doctor's check process; run: lora-otel doctor\n")
    sys.exit(2)
