"""``lora-otel report``: what the command writes and where it reads, without a browser.

The page's script and what a person sees in a real browser are tested in test_report_browser.py;
here: the inputs it accepts (journal, --log path, directory), the data the page carries (lanes in
order, the stalled span, the diagnosis), redaction, text from the journal that cannot break out of
the page, the --format perfetto wiring, and the line inspect and watch end a stalled job with.
"""

from __future__ import annotations

import json
import re
import stat
import sys
import types
from typing import Any

import pytest
from conftest import JournalBuilder
from test_inspect_dir import stuck_in_import_job

from lora_otel.cli import main
from lora_otel.cli.report_html import render_html
from lora_otel.journal.reader import read_journal

SECRETS = [
    "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    "sk-proj-Zq8mX2vLk9RtY4uWp7sDf3gHj6kL1mN0",
    "hunter2-very-secret-password",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
]


def page_data(page: str) -> dict[str, Any]:
    """The JSON document the page's script draws from."""
    m = re.search(r'<script type="application/json" id="lora-otel-data">(.*?)</script>', page, re.S)
    assert m, "the page carries its data"
    return json.loads(m.group(1))


def report(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["report", *args])
    out, err = capsys.readouterr()
    return status, out, err


def stall_record(builder: JournalBuilder, t: float, **fields: Any) -> None:
    """A ``stall`` record as the watchdog appends it (its ``kind`` field is the stall's)."""
    builder.raw(json.dumps({"v": 1, "k": "stall", "ts": builder.ns(t), **fields}).encode() + b"\n")


def big_journal(builder: JournalBuilder, spans: int = 10_000) -> None:
    """A long job of exactly ``spans`` spans: 1000 imports, then training of an hour whose epochs hold
    evaluations and checkpoints with shards, a beat a second with steps, events on the epochs; the
    last checkpoint still open and stalled (a ``stall`` record, the watchdog's)."""
    root = builder.process(attrs={"service.name": "train_big", "process.pid": 4242})
    builder.span("arguments", 0.0, 0.01)
    t, made = 0.02, 2
    for i in range(1000):
        builder.span(f"import package_{i}", t, 0.004)
        t += 0.005
        made += 1
    training = builder.start("training", t)
    made += 1
    epoch = None
    left = spans - made - 1  # the stalled checkpoint is the last
    step, tick = 0, t
    while left > 0:
        if epoch is None or left % 50 == 0:
            if epoch is not None:
                builder.end(epoch, t)
            epoch = builder.start(f"epoch {made}", t, parent=training)
            builder.event(epoch, t, "lr", {"lora_otel.lr": 1e-4})
            made += 1
            left -= 1
            continue
        kind = "eval" if left % 3 else "save checkpoint"
        builder.span(kind, t, 0.3, parent=epoch, attrs={"lora_otel.shard": left % 7})
        t += 0.36
        made += 1
        left -= 1
        while tick + 1 <= t:
            tick += 1
            step += 3
            builder.beat(tick, steps=step, last_step_t=tick - 0.1)
    if epoch is not None:
        builder.end(epoch, t)
    stuck = builder.start("save checkpoint", t + 0.1, parent=training)
    builder.beat(t + 100, steps=step, last_step_t=t)
    stall_record(
        builder,
        t + 100,
        span_id=stuck,
        stage="save checkpoint",
        kind="alive",
        limit_s=60.0,
        open_s=99.9,
        evidence={"process.state": "D (disk sleep)"},
        diagnosis="Waiting on the disk: the checkpoint write has not finished.",
        by="watchdog",
    )
    assert root


class TestInputs:
    def test_directory_gives_one_job_in_lanes(self, capsys, tmp_path):
        """A directory: the job's processes as lanes in inspect's order (launcher, rank 0, rank 1);
        rank 1's open import is the stalled span, with inspect's story as the diagnosis."""
        stuck_in_import_job(tmp_path)
        out = tmp_path / "job.html"
        status, _, err = report(capsys, str(tmp_path), "-o", str(out))
        assert status == 0, err
        assert err.startswith(f"lora-otel report: wrote {out} (3 processes, ")
        page = out.read_text(encoding="utf-8")
        [job] = page_data(page)["jobs"]
        assert [lane["label"] for lane in job["lanes"]] == ["launcher", "rank 0", "rank 1"]
        rank1 = job["lanes"][2]
        [stalled] = [span for span in rank1["spans"] if span[4] == 3]
        assert stalled[0] == "import bitsandbytes"
        assert rank1["diagnosis"].startswith("STALLED: stuck in import bitsandbytes for 312 s")
        assert "rank 1 (pid " in page and "is the one stuck: in import bitsandbytes for 312 s" in page

    def test_one_journal_brings_its_whole_trace(self, capsys, tmp_path):
        """One rank's journal: the page shows every journal beside it of the same trace."""
        stuck_in_import_job(tmp_path)
        out = tmp_path / "job.html"
        assert report(capsys, str(tmp_path / "b-rank0.otel.jsonl"), "-o", str(out))[0] == 0
        [job] = page_data(out.read_text(encoding="utf-8"))["jobs"]
        assert [lane["label"] for lane in job["lanes"]] == ["launcher", "rank 0", "rank 1"]

    def test_log_path_reads_its_journal(self, capsys, tmp_path):
        """The --log path a job was given stands for its journal, as for inspect; -o - writes to stdout."""
        builder = JournalBuilder(tmp_path / "run.log.otel.jsonl")
        root = builder.process()
        builder.span("training", 1.0, 2.0)
        builder.end(root, 3.5)
        builder.exit(3.5)
        status, out, _ = report(capsys, str(tmp_path / "run.log"), "-o", "-")
        assert status == 0
        [job] = page_data(out)["jobs"]
        assert [span[0] for span in job["lanes"][0]["spans"]] == ["process", "training"]
        assert "finished normally in 3.5 s (exit code 0)" in out

    @pytest.mark.parametrize("what", ["missing", "empty dir", "not a journal"])
    def test_nothing_to_read_is_status_2(self, capsys, tmp_path, what):
        """Nothing to read: exit status 2, one line on stderr, no file written."""
        target = tmp_path / "x"
        if what == "empty dir":
            target.mkdir()
        elif what == "not a journal":
            target = tmp_path / "plain.otel.jsonl"
            target.write_text("just a log line\n")
        status, _, err = report(capsys, str(target), "-o", str(tmp_path / "job.html"))
        assert status == 2 and err.startswith("lora-otel report: ") and err.count("\n") == 1, err
        assert not (tmp_path / "job.html").exists()


class TestPage:
    def test_no_secret_reaches_the_page(self, journal):
        """Secrets a journal carries (one written by an older lora_otel, or edited by hand) are
        redacted on the page: by shape, by a secret attribute name, in name=value text."""
        root = journal.process(
            attrs={
                "service.name": "train.py",
                "process.command_args": ["train.py", "--hf_token", SECRETS[0], f"--api-key={SECRETS[1]}"],
                "lora_otel.env.DB_PASSWORD": SECRETS[2],
                "lora_otel.env.HUB": f"https://user:{SECRETS[2]}@hub.example.com/repo",
            }
        )
        load = journal.start("load model", 0.5, attrs={"note": f"Authorization: Bearer {SECRETS[3]}"})
        journal.event(load, 0.6, "download", {"url": f"https://hub.example.com/x?token={SECRETS[0]}"})
        journal.end(load, 1.0, status="error", message=f"HTTPError 401 for password={SECRETS[2]}")
        journal.end(root, 1.1, status="error", message="exit code 1")
        journal.exit(1.1, code=1, how="exception", message=f"OSError: bad token {SECRETS[0]}")
        page = render_html([journal.read()], journal.ns(2.0))
        leaked = [secret for secret in SECRETS if secret in page]
        assert leaked == [], leaked
        assert "[REDACTED]" in page

    def test_journal_text_cannot_break_out_of_the_page(self, journal):
        """Span names are data: a ``</script>`` or a template placeholder in one changes nothing of
        the page's markup."""
        root = journal.process()
        journal.span("</script><script>alert(1)</script>", 0.1, 0.2)
        journal.span("%SCRIPT% %DATA% <b>bold</b>", 0.4, 0.2)
        journal.end(root, 1.0)
        journal.exit(1.0)
        page = render_html([journal.read()], journal.ns(2.0))
        assert page.count("<script") == 2 and page.count("</script>") == 2
        names = [span[0] for span in page_data(page)["jobs"][0]["lanes"][0]["spans"]]
        assert names[1:] == ["</script><script>alert(1)</script>", "%SCRIPT% %DATA% <b>bold</b>"]
        assert "<b>bold</b>" not in page

    def test_nothing_is_fetched(self, journal):
        """The page names no URL to load: no src/href but the inline favicon, and a policy that allows no fetch."""
        root = journal.process()
        journal.end(root, 1.0)
        journal.exit(1.0)
        page = render_html([journal.read()], journal.ns(2.0))
        assert re.findall(r'\b(?:src|href)="([^"]*)"', page) == ["data:,"]
        assert "default-src 'none'" in page

    @pytest.mark.slow
    def test_ten_thousand_spans(self, tmp_path):
        """A 10,000-span journal: every span is in the page (drawn by the script as they scroll into
        view), the stalled checkpoint marked, the steps plotted; a few MB at most."""
        builder = JournalBuilder(tmp_path / "big.otel.jsonl")
        big_journal(builder)
        journal = read_journal(builder.path)
        assert len(journal.spans) == 10_000 and journal.problems == []
        page = render_html([journal], builder.ns(4000))
        [lane] = page_data(page)["jobs"][0]["lanes"]
        assert len(lane["spans"]) == 10_000
        assert [span[0] for span in lane["spans"] if span[4] == 3] == ["save checkpoint"]
        assert lane["diagnosis"].endswith("Waiting on the disk: the checkpoint write has not finished.")
        assert '<svg class="steps"' in page
        assert len(page.encode()) < 5_000_000


class TestPerfettoFormat:
    def test_calls_trace_events(self, capsys, tmp_path, monkeypatch):
        """--format perfetto writes the Trace Event document `lora_otel.export.perfetto.trace_events` gives."""
        seen: list[Any] = []

        def trace_events(journals, now_ns):
            seen.append([j.path for j in journals])
            return {"traceEvents": [], "displayTimeUnit": "ms"}

        monkeypatch.setitem(sys.modules, "lora_otel.export.perfetto", types.SimpleNamespace(trace_events=trace_events))
        stuck_in_import_job(tmp_path)
        out = tmp_path / "job.json"
        assert report(capsys, str(tmp_path), "--format", "perfetto", "-o", str(out))[0] == 0
        assert json.loads(out.read_text()) == {"traceEvents": [], "displayTimeUnit": "ms"}
        assert len(seen[0]) == 3

    def test_missing_module_is_a_clear_error(self, capsys, tmp_path, monkeypatch):
        """Without the Perfetto exporter installed: one line saying so, status 2."""
        monkeypatch.setitem(sys.modules, "lora_otel.export.perfetto", None)
        stuck_in_import_job(tmp_path)
        status, _, err = report(capsys, str(tmp_path), "--format", "perfetto", "-o", str(tmp_path / "j.json"))
        assert (status, err) == (
            2,
            "lora-otel report: --format perfetto is not available: this installation has "
            "no lora_otel.export.perfetto\n",
        )


class TestWhereUsersMeetIt:
    def stalled(self, journal: JournalBuilder) -> None:
        """A process gone while stuck in an import, which the watchdog had declared stalled."""
        root = journal.process()
        stuck = journal.start("import slowmod", 0.2)
        journal.beat(30.0)
        stall_record(
            journal,
            30.0,
            span_id=stuck,
            stage="import slowmod",
            kind="alive",
            limit_s=20.0,
            open_s=29.8,
            evidence={},
            diagnosis="Cannot tell why.",
            by="watchdog",
        )
        assert root

    def test_inspect_ends_a_stalled_job_with_the_report_command(self, capsys, journal):
        """inspect's last line: the command that writes the stalled job's report."""
        self.stalled(journal)
        assert main(["inspect", str(journal.path)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[-1] == f"report: lora-otel report {journal.path} -o job.html"

    def test_watch_too(self, capsys, journal):
        """watch's view ends the same way (here --once, on the directory)."""
        self.stalled(journal)
        main(["watch", "--once", str(journal.path.parent)])
        lines = capsys.readouterr().out.splitlines()
        assert lines[-1] == f"report: lora-otel report {journal.path.parent} -o job.html"

    def test_not_for_a_job_that_finished(self, capsys, journal):
        """A job that finished normally is not sent to a report."""
        root = journal.process()
        journal.end(root, 1.0)
        journal.exit(1.0)
        assert main(["inspect", str(journal.path)]) == 0
        assert "lora-otel report" not in capsys.readouterr().out


class TestOutputFile:
    """Where the report goes (issue 16's hostile trial): never over the job's own files, whole or
    not at all, never through a symlink, private like the journals."""

    def finished(self, journal: JournalBuilder) -> None:
        journal.process()
        journal.span("training", 0.5, 2.0)
        journal.exit(3.5)

    def test_never_over_the_jobs_own_journal(self, capsys, journal):
        """`-o` naming the journal itself (a typo, a tab completion) refuses: the journal is the
        job's only record (it was overwritten with HTML before)."""
        self.finished(journal)
        before = journal.path.read_bytes()
        status, _, err = report(capsys, str(journal.path), "-o", str(journal.path))
        assert status == 2 and "is the job's own file" in err and err.count("\n") == 1, err
        assert journal.path.read_bytes() == before

    def test_an_existing_file_is_replaced_and_said(self, capsys, journal, tmp_path):
        self.finished(journal)
        out = tmp_path / "old.html"
        out.write_text("an older report")
        status, _, err = report(capsys, str(journal.path), "-o", str(out))
        assert status == 0 and err.startswith(f"lora-otel report: replaced {out} "), err
        assert out.read_text().startswith("<!DOCTYPE html>")

    def test_a_symlink_is_replaced_not_written_through(self, capsys, journal, tmp_path):
        self.finished(journal)
        victim = tmp_path / "victim.txt"
        victim.write_text("precious")
        link = tmp_path / "link.html"
        link.symlink_to(victim)
        status, _, err = report(capsys, str(journal.path), "-o", str(link))
        assert status == 0, err
        assert victim.read_text() == "precious"
        assert not link.is_symlink() and link.read_text().startswith("<!DOCTYPE html>")

    def test_the_report_is_private_like_the_journal(self, capsys, journal, tmp_path):
        self.finished(journal)
        out = tmp_path / "job.html"
        assert report(capsys, str(journal.path), "-o", str(out))[0] == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".lora-otel-report-")] == []

    def test_a_directory_with_nothing_readable_is_status_2(self, capsys, tmp_path):
        """Only files that are not journals: nothing to show, exit 2 (it wrote an empty page, 0)."""
        (tmp_path / "a.otel.jsonl").write_text("not json\n")
        (tmp_path / "b.otel.jsonl").write_text("nor this\n")
        status, _, err = report(capsys, str(tmp_path), "-o", str(tmp_path / "job.html"))
        assert status == 2 and "nothing to show" in err, err
        assert not (tmp_path / "job.html").exists()

    def test_the_suggested_command_is_safe_for_odd_paths(self):
        """The `report:` line quotes the path, keeps a leading dash from reading as an option, and
        does not print a path a line cannot show."""
        from lora_otel.cli.inspect import report_command

        assert report_command("runs dir/it's") == "report: lora-otel report 'runs dir/it'\"'\"'s' -o job.html"
        assert report_command("-dash") == "report: lora-otel report ./-dash -o job.html"
        assert "PATH" in report_command("a\nb") and "\n" not in report_command("a\nb")
