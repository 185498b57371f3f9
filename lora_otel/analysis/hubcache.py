"""Whether a model a job waits to download from the Hugging Face Hub is in the local cache already.

A job waiting on the network inside ``huggingface_hub`` (the ``hub download`` rule) may be asking
the Hub about a model it has downloaded before: with ``HF_HUB_OFFLINE=1`` it would load it from the
cache without the network. That is a step only when the evidence shows it: the repo id named on a
source line of the waiting thread's own frames (``from_pretrained("org/name")``, ``repo_id=...``),
and that repo's snapshot present in the job's cache directory (``HF_HUB_CACHE``, ``HF_HOME/hub``,
``XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``, read from the job's own
environment). `facts` gathers ``lora_otel.evidence.hub.*``; `advice` says the step. Nothing here
signals the process or raises.
"""

from __future__ import annotations

import linecache
import os
import re
from collections.abc import Mapping
from typing import Any, Optional

KEY = "lora_otel.evidence.hub."
MAX_REPOS = 4
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
# A quoted repo id on a source line: "org/name" (the Hub's form), or the first argument of a call
# that names one (from_pretrained("gpt2"), hf_hub_download("org/x", ...)), or repo_id="...".
_ORG_NAME = re.compile(r"""["']([A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})["']""")
_CALL_ARG = re.compile(
    r"""(?:from_pretrained|hf_hub_download|snapshot_download|pipeline|load_dataset)\(\s*["']([A-Za-z0-9][\w./-]{0,190})["']"""
    r"""|repo_id\s*=\s*["']([A-Za-z0-9][\w./-]{0,190})["']"""
)
_ENV_NAMES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME", "HF_HUB_OFFLINE")


def repo_ids(stacks: str) -> list[str]:
    """Repo ids quoted on the source lines of the stacks' frames outside installed packages and
    Python's library (the program's own calls), innermost first, at most `MAX_REPOS`."""
    found: list[str] = []
    for line in stacks.splitlines():
        m = _FRAME.match(line)
        if not m or any(p in m.group(1) for p in ("/site-packages/", "/dist-packages/", "/lib/python3", "<")):
            continue
        path = m.group(1)
        try:
            if not os.path.isfile(path):  # never a FIFO a dump may name
                continue
        except (OSError, ValueError):
            continue
        text = linecache.getline(path, int(m.group(2)))
        for hit in [*_CALL_ARG.finditer(text), *_ORG_NAME.finditer(text)]:
            repo = next(g for g in hit.groups() if g)
            if not repo.startswith(("./", "../")) and repo not in found:
                found.append(repo)
    return found[:MAX_REPOS]


def cache_dir(env: Mapping[str, str]) -> str:
    """The Hub cache directory ``huggingface_hub`` uses in an environment ``env``."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return os.path.expanduser(env[name])
    if env.get("HF_HOME"):
        return os.path.join(os.path.expanduser(env["HF_HOME"]), "hub")
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "huggingface", "hub")


def cached(cache: str, repo: str) -> bool:
    """Whether ``repo`` (a model, dataset or space) has a snapshot with files in ``cache``."""
    for kind in ("models", "datasets", "spaces"):
        snapshots = os.path.join(cache, "%s--%s" % (kind, repo.replace("/", "--")), "snapshots")
        try:
            for rev in os.listdir(snapshots):
                if os.listdir(os.path.join(snapshots, rev)):
                    return True
        except OSError:
            continue
    return False


def _environ(pid: int) -> dict[str, str]:
    """The job's own values of `_ENV_NAMES` (only those: the rest may hold secrets), {} when unreadable."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        if name.decode("ascii", "replace") in _ENV_NAMES:
            out[name.decode("ascii")] = value.decode("utf-8", "replace")
    return out


def facts(pid: int, stacks: str, env: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """For a process with ``huggingface_hub`` on its stacks: the repo ids its own frames name
    (``hub.repo_ids``), its cache directory (``hub.cache_dir``), those of the repos found there
    (``hub.cached``) and whether it runs offline already (``hub.offline``). {} otherwise."""
    if "huggingface_hub" not in stacks:
        return {}
    try:
        repos = repo_ids(stacks)
        if not repos:
            return {}
        env = dict(_environ(pid) if env is None else env)
        cache = cache_dir(env)
        out: dict[str, Any] = {KEY + "repo_ids": repos, KEY + "cache_dir": cache}
        out[KEY + "cached"] = [repo for repo in repos if cached(cache, repo)]
        if env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
            out[KEY + "offline"] = True
        return out
    except Exception as e:  # noqa: BLE001 - evidence is best effort; the other facts stand
        return {KEY + "error": "%s: %s" % (type(e).__name__, e)}


def advice(evidence: Mapping[str, Any]) -> str:
    """``org/name is in the local Hugging Face cache already (…): set HF_HUB_OFFLINE=1 …`` when the
    evidence shows the repo the job waits for cached; "" otherwise (no guess that it is)."""
    found = [str(r) for r in evidence.get(KEY + "cached") or ()]
    if not found or evidence.get(KEY + "offline"):
        return ""
    return (
        "%s %s in the local Hugging Face cache already (%s): start the job with HF_HUB_OFFLINE=1 to load %s "
        "from there without the network."
        % (
            " and ".join(found),
            "are" if len(found) > 1 else "is",
            evidence.get(KEY + "cache_dir"),
            "them" if len(found) > 1 else "it",
        )
    )
