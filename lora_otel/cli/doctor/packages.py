"""The Python and the installed packages, checked from their metadata without importing them:
Python against ``Requires-Python`` of lora_otel and of each installed training-stack package, and
each package's declared requirements (markers evaluated for this interpreter, extras ignored)
against what is installed. ``packaging`` when it is importable, else a small built-in parser of
versions, specifiers and markers (PEP 440 and PEP 508, the parts requirements use)."""

from __future__ import annotations

import os
import sys
import time

from lora_otel.cli.doctor.report import Check
from lora_otel.cli.doctor.training import STACK

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the check process imports every module here, and not typing
    from collections.abc import Iterable
    from importlib.metadata import Distribution
    from typing import Any


LORA_OTEL_REQUIRES_PYTHON = ">=3.9"


# --- versions, specifiers, markers (packaging when importable, else a small fallback) ----------


def _packaging() -> tuple[Any, Any, Any, Any, Any] | None:
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


def _parse_version(text: str) -> dict[str, Any] | None:
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
        pre_k: tuple[float, ...] = (-inf,)  # 1.0.dev1 sorts before 1.0a1
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


def _version_key(text: str) -> tuple[Any, ...] | None:
    v = _parse_version(text)
    return None if v is None else v["key"]


def _fallback_contains(spec: str, version: str) -> bool:
    """Whether ``version`` satisfies the comma-separated specifiers ``spec`` (fallback, PEP 440 lite:
    pre-releases allowed, local versions ignored unless the specifier has one)."""
    import re

    v = _parse_version(version)
    if v is None:
        return True  # an unparsable installed version: cannot judge, so not flagged
    public = _parse_version(version.split("+", 1)[0]) or v  # v parses, so its public part does
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
        # >V excludes V's post-releases (and V itself), unless V is one
        if op == ">" and (
            not vk > tk or (t["post"] is None and public["post"] is not None and public["key"][:3] == tk[:3])
        ):
            return False
        # <V excludes V's pre-releases, unless V is one
        if op == "<" and (
            not vk < tk
            or (
                t["pre"] is None
                and t["dev"] is None
                and public["key"][:2] == tk[:2]
                and (public["pre"] is not None or public["dev"] is not None)
            )
        ):
            return False
        if op == "~=":
            upper = t["release"][:-1]
            if vk < tk or (public["release"] + [0] * len(upper))[: len(upper)] != upper:
                return False
    return True


def _marker_env() -> dict[str, str]:
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


def _fallback_marker(text: str, env: dict[str, str]) -> bool:
    """Evaluate a PEP 508 marker (fallback): ``and``/``or``/parentheses, comparisons, ``in``/``not in``."""
    import re

    tokens: list[str] = re.findall(
        r"\(|\)|'[^']*'|\"[^\"]*\"|===|==|!=|~=|<=|>=|<|>|not\s+in\b|\bin\b|\band\b|\bor\b|[\w.]+", text
    )
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def value(tok: str) -> tuple[str, bool]:
        if tok[:1] in ("'", '"'):
            return tok[1:-1], False
        return str(env.get(tok, "")), tok in _VERSION_VARS

    def comparison() -> bool:
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

    def conjunction() -> bool:
        r = comparison()
        while peek() == "and":
            take()
            r = comparison() and r
        return r

    def expr() -> bool:
        r = conjunction()
        while peek() == "or":
            take()
            r = conjunction() or r
        return r

    try:
        return bool(expr())
    except Exception:  # noqa: BLE001 - an unreadable marker: count the requirement as applying
        return True


def _parse_requirement(text: str) -> tuple[str, str, str | None, str | None] | None:
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

    def __init__(self, name: str, spec: str, marker: str | None, url: str | None, text: str) -> None:
        self.name, self.spec, self.marker, self.url, self.text = name, spec, marker, url, text


def _requirement(text: str, env: dict[str, str]) -> _Req | None:
    """The requirement ``text`` if it applies here (marker true with no extra), else None."""
    pk = _packaging() if _USE_PACKAGING else None
    if pk is not None:
        requirement = pk[0]
        try:
            r = requirement(text)
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
        _, specifier_set, version_class, invalid_version, _ = pk
        try:
            return bool(specifier_set(spec).contains(version_class(version), prereleases=True))
        except (invalid_version, ValueError):
            return True  # an unparsable version or specifier: cannot judge, not flagged
        except Exception:  # noqa: BLE001
            return True
    return _fallback_contains(spec, version)


# --- package metadata --------------------------------------------------------------------------


def _norm(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _dist(name: str) -> Distribution | None:
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


def _dists_for_modules(modules: Iterable[str]) -> list[str]:
    """Distribution names providing the top-level packages of ``modules`` (when metadata says)."""
    from importlib import metadata

    tops = {m.partition(".")[0] for m in modules}
    if not tops:
        return []
    found: list[str] = []
    try:
        mapping = metadata.packages_distributions()  # Python 3.10+
    except Exception:  # noqa: BLE001
        mapping = {}
    for top in sorted(tops):
        for d in mapping.get(top, [top] if _dist(top) is not None else []):
            if d not in found:
                found.append(d)
    return found


def checked_distributions(also_import: Iterable[str] = ()) -> list[str]:
    """lora_otel, the installed packages of the training stack as lora_otel knows it
    (``envfacts.PACKAGES``), and the distributions of the ``--also-import`` modules."""
    from lora_otel._boot.seam import envfacts

    names = ["lora_otel", *dict.fromkeys([*STACK, *envfacts.PACKAGES])]
    names += _dists_for_modules(also_import)
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        key = _norm(name)
        if key in seen or _dist(name) is None:
            continue
        seen.add(key)
        out.append(name)
    return out


def check_python(dists: Iterable[str]) -> list[Check]:
    """Python against lora_otel's own ``Requires-Python`` (>=3.9) and each distribution's."""
    import platform

    t0 = time.perf_counter()
    here = platform.python_version()
    seen: list[tuple[str, str, str]] = []
    unmet: list[tuple[str, str, str]] = []
    for name in dists:
        d = _dist(name)
        req = None
        if d is not None:
            try:
                req = d.metadata.get("Requires-Python")  # type: ignore[attr-defined]  # an email.message.Message
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
        own = {n: r for n, _, r in seen}.get("lora_otel", LORA_OTEL_REQUIRES_PYTHON)
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


def check_requirements(dists: Iterable[str]) -> list[Check]:
    """Each distribution's declared requirements (markers for this interpreter, no extras) against
    what is installed: a missing one fails, a version outside the range warns (the import lines
    tell whether it breaks anything)."""
    t0 = time.perf_counter()
    env = _marker_env()
    out: list[Check] = []
    n_reqs = 0
    checked: list[str] = []
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
