"""A stall's evidence as a recorded case, for the rules' table test (tests/data/evidence/).

With ``LORA_OTEL_RECORD_EVIDENCE=<dir>`` in the environment of whatever diagnoses a stall (the
sidecar or local watchdog, through `export.watchdog.diagnose_stall`; ``inspect``/``watch``, through
`verdict.current`), each diagnosis also writes ``<dir>/<rule>-<pid>-<time>.json``: the stall, the
evidence, the journal (its records, so the rules read it as they did), the peers and what the
diagnosis said — redacted with the seam's redaction, the interpreter's and the home directory's
paths made generic. Its ``expect`` is left ``null``: whoever adds the file to tests/data/evidence
writes there what is *true* about the case (tests/evidence_cases.py documents the format).

Never raises and never delays the diagnosis by more than writing one file.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from lora_otel._boot.seam import redact_text
from lora_otel.journal.reader import Journal
from lora_otel.journal.records import Span

ENV = "LORA_OTEL_RECORD_EVIDENCE"
MAX_RECORDS = 5000
"""A journal with more records than this is recorded by its few read fields only (pid, frames, root attrs)."""
MAX_PEERS = 16


def target_dir(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The directory ``LORA_OTEL_RECORD_EVIDENCE`` names, or None (unset, empty, ``0``)."""
    value = (os.environ if env is None else env).get(ENV, "")
    return None if value in ("", "0") else value


def journal_case(journal: Journal) -> dict[str, Any]:
    """What the rules read of ``journal``: its records (every one but the beats, and its last beat)
    where the file can still be read and is not long; else pid, main frames and the root's attributes."""
    out: dict[str, Any] = {
        "path": journal.path,
        "pid": journal.pid,
        "main_frames": journal.main_frames,
        "root_attrs": dict(journal.root.attrs) if journal.root is not None else {},
    }
    try:
        with open(journal.path, "rb") as f:
            rows = [json.loads(line) for line in f.read(64 << 20).splitlines() if line.strip()]
    except (OSError, ValueError):
        return out
    beats = [r for r in rows if isinstance(r, dict) and r.get("k") == "beat"]
    rows = [r for r in rows if not isinstance(r, dict) or r.get("k") not in ("beat", "stall")] + beats[-1:]
    if len(rows) <= MAX_RECORDS:
        out["records"] = rows
    return out


def case_of(
    stall: Any,
    evidence: Mapping[str, Any],
    journal: Optional[Journal],
    found: Any,
    peers: Iterable[Journal] = (),
    peer_stacks: Optional[Mapping[str, str]] = None,
    now_ns: Optional[int] = None,
    frozen_after_s: Optional[float] = None,
    source: str = "",
) -> dict[str, Any]:
    """The recorded case (tests/evidence_cases.py's format), redacted, paths made generic, ``expect`` null."""
    span: Span = stall.span
    case: dict[str, Any] = {
        "case": "",
        "source": source or "recorded by %s=<dir>" % ENV,
        "stall": {
            "kind": stall.kind,
            "stage": span.name,
            "open_for_s": round(float(stall.open_for_s), 3),
            "limit_s": stall.limit_s,
            "attrs": dict(span.attrs),
            "after": stall.after,
            "frozen_after_s": frozen_after_s,
        },
        "now_ns": now_ns,
        "journal": journal_case(journal) if journal is not None else None,
        "peers": [journal_case(peer) for peer in list(peers)[:MAX_PEERS]],
        "peer_stacks": dict(peer_stacks or {}),
        "evidence": dict(evidence),
        "diagnosis": {
            "rule": found.attrs.get("lora_otel.diagnosis.rule"),
            "sentence": found.sentence,
            "advice": found.advice,
        },
        "expect": None,
    }
    rule = str(case["diagnosis"]["rule"] or "none")
    case["case"] = "%s-%s" % (re.sub(r"[^a-z0-9]+", "_", rule.lower()).strip("_"), journal.pid if journal else "job")
    generic = _generic_paths(journal)
    return _redacted(case, generic)  # type: ignore[no-any-return]


def record(
    stall: Any,
    evidence: Mapping[str, Any],
    journal: Optional[Journal],
    found: Any,
    peers: Iterable[Journal] = (),
    peer_stacks: Optional[Mapping[str, str]] = None,
    now_ns: Optional[int] = None,
    frozen_after_s: Optional[float] = None,
    source: str = "",
    env: Optional[Mapping[str, str]] = None,
) -> Optional[str]:
    """Write the case to the directory ``LORA_OTEL_RECORD_EVIDENCE`` names; the file's path, or
    None (unset, or it could not be written). Never raises."""
    out = target_dir(env)
    if out is None:
        return None
    try:
        case = case_of(stall, evidence, journal, found, peers, peer_stacks, now_ns, frozen_after_s, source)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "%s-%d.json" % (case["case"], now_ns or 0))
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(case, indent=1, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, path)
        return path
    except Exception:  # noqa: BLE001 - recording is a test aid; the diagnosis goes on
        return None


def _generic_paths(journal: Optional[Journal]) -> list[tuple[str, str]]:
    """(real, generic) prefixes, longest first: the traced process's working directory as ``/job``,
    the journal's directory as ``/journals`` (its parent as ``/job`` when it is a ``lora-otel``
    folder and the working directory is not known), the interpreter's prefixes, the home directory,
    the directory lora_otel is installed in (``/site-packages``)."""
    pairs: list[tuple[str, str]] = []
    if journal is not None and journal.path:
        cwd = journal.root.attrs.get("process.working_directory") if journal.root is not None else None
        here = os.path.dirname(os.path.abspath(journal.path))
        if isinstance(cwd, str) and cwd.startswith("/"):
            pairs.append((cwd.rstrip("/") or "/", "/job"))
            if not here.startswith(cwd.rstrip("/") + "/"):
                pairs.append((here, "/journals"))
        else:
            pairs.append((os.path.dirname(here) if os.path.basename(here) == "lora-otel" else here, "/job"))
    own = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where lora_otel is
    pairs += [(sys.prefix, "/venv"), (sys.base_prefix, "/python"), (os.path.expanduser("~"), "/home/user")]
    pairs.append((own, "/site-packages"))
    pairs = [(real, generic) for real, generic in pairs if len(real) > 1]
    return sorted(pairs, key=lambda p: -len(p[0]))


def _redacted(value: Any, generic: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for real, name in generic:
            value = value.replace(real, name)
        # Line by line: the redaction clips one value at its limit; a stack is many lines.
        return "\n".join(redact_text(line) if line else line for line in value.split("\n"))
    if isinstance(value, dict):
        return {str(_redacted(k, generic)): _redacted(v, generic) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v, generic) for v in value]
    return value
