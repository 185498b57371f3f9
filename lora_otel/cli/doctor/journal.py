"""The check process's journal: whether it was traced at all, whether its journal reads, how many
spans (and imports) it holds, and whether it was exported live to the configured OTLP endpoint."""

from __future__ import annotations

import os
import sys

from lora_otel.cli.doctor.report import Check, _rel

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the check process imports every module here, and not typing
    from lora_otel.cli.doctor.follow import _Run


def _journal_check(journal: str, run: _Run) -> Check:
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
