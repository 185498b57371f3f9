"""The journal reader: spans from records, and tolerance of everything a crash leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FUZZ, journal_lines
from hypothesis import given
from hypothesis import strategies as st

from lora_otel.journal.reader import (
    JournalError,
    format_duration,
    process_state,
    read_journal,
    start_ticks_from_stat,
)


def complete_run(journal) -> None:
    """A process that parses arguments, imports torch, trains 3 steps and exits 0."""
    root = journal.process()
    journal.line(0.001, "started: python train.py")
    journal.span("arguments", 0.002, 0.001)
    torch = journal.start("import torch", 0.01, attrs={"lora_otel.module": "torch"})
    journal.end(torch, 2.31, attrs={"lora_otel.package.version": "2.13.0"})
    training = journal.start("training", 3.0)
    journal.event(training, 3.5, "checkpoint saved", {"step": 2})
    journal.beat(4.0, steps=3, last_step_t=3.9)
    journal.end(training, 12.0)
    journal.end(root, 12.29)
    journal.exit(12.3, code=0)


class TestSpans:
    def test_complete_journal(self, journal):
        """Every record lands: spans in start order with parents, ends, attributes merged at end,
        events, beats, lines, the exit record, and no problems."""
        complete_run(journal)
        j = journal.read()
        assert [s.name for s in j.spans] == ["process", "arguments", "import torch", "training"]
        assert j.root is j.spans[0] and j.root.parent_id is None
        assert all(s.parent_id == j.root.span_id for s in j.spans[1:])
        assert all(not s.is_open and s.status == "ok" for s in j.spans)
        torch = j.spans[2]
        assert torch.attrs == {"lora_otel.module": "torch", "lora_otel.package.version": "2.13.0"}
        assert torch.end_ns - torch.start_ns == 2_300_000_000
        assert j.spans[3].events == [(journal.ns(3.5), "checkpoint saved", {"step": 2})]
        assert (j.pid, j.beats, j.steps, j.last_step_ns) == (os.getpid(), 1, 3, journal.ns(3.9))
        assert j.config == {"import_threshold_ms": 5} and j.sampled is True
        assert [line.msg for line in j.lines] == ["started: python train.py"]
        assert j.exit == {"ts": journal.ns(12.3), "code": 0, "how": "normal", "message": None}
        assert j.last_evidence_ns == journal.ns(12.3)
        assert j.trace_id == j.root.trace_id and j.problems == []

    def test_spans_ordered_by_start_not_file_order(self, journal):
        """Spans are listed by start time even when their records arrive out of order."""
        journal.process()
        journal.start("late", 2.0)
        journal.start("early", 1.0)
        assert [s.name for s in journal.read().spans] == ["process", "early", "late"]

    def test_open_span_and_error_span(self, journal):
        """A span without an end is open (end None, status unset); an error end keeps its message."""
        journal.process()
        failed = journal.start("load model", 1.0)
        journal.end(failed, 1.5, status="error", message="OSError: no such file")
        journal.start("import bitsandbytes", 2.0)
        j = journal.read()
        assert (j.spans[1].status, j.spans[1].message) == ("error", "OSError: no such file")
        assert j.spans[2].is_open and j.spans[2].end_ns is None and j.spans[2].status == "unset"

    def test_duplicate_start_keeps_the_first(self, journal):
        """A second start record with a known span_id is reported and ignored."""
        journal.process()
        span_id = journal.start("first", 1.0)
        journal.record(
            "start",
            2.0,
            trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
            span_id=span_id,
            parent_id=journal.root_id,
            name="second",
            attrs={},
        )
        j = journal.read()
        assert [s.name for s in j.spans] == ["process", "first"]
        assert j.problems == [f"line 3: duplicate start of span {span_id} ('second'); the first ('first') is kept"]

    def test_end_for_unknown_span_and_second_end(self, journal):
        """An end for a span that never started, and a second end of a span, are reported by line."""
        journal.process()
        span_id = journal.span("import os", 0.1, 0.1)
        journal.end("00000000deadbeef", 1.0)
        journal.end(span_id, 2.0)
        j = journal.read()
        assert j.problems == [
            "line 4: end for unknown span 00000000deadbeef",
            f"line 5: second end of span {span_id} ('import os'); the first is kept",
        ]
        assert j.spans[1].end_ns == journal.ns(0.2)

    def test_traceparent_parent_and_unsampled(self, journal):
        """The process span's parent is the TRACEPARENT span, and ``sampled`` is read."""
        journal.process(parent_id="b7ad6b7169203331", sampled=False)
        j = journal.read()
        assert j.root.parent_id == "b7ad6b7169203331" and j.sampled is False

    def test_no_process_span(self, journal):
        """A journal whose process start was lost still gives its spans, and says what is missing."""
        journal.start("import torch", 1.0, parent="00f067aa0ba902b7")
        j = journal.read()
        assert j.root is None and j.pid is None and [s.name for s in j.spans] == ["import torch"]
        assert any("no 'process' span" in p for p in j.problems)


class TestDamage:
    def test_truncated_last_line(self, journal):
        """An unterminated last line that is not JSON is skipped and reported as truncated."""
        journal.process()
        journal.raw(b'{"v":1,"k":"beat","ts":179599')
        j = journal.read()
        assert j.beats == 0 and j.problems == ["line 2: truncated (incomplete last record)"]

    def test_complete_last_line_without_newline(self, journal):
        """An unterminated last line that *is* a whole record is read, silently."""
        journal.process()
        journal.raw(json.dumps({"v": 1, "k": "beat", "ts": journal.ns(1), "steps": 4}).encode())
        j = journal.read()
        assert (j.beats, j.steps, j.problems) == (1, 4, [])

    def test_corrupt_middle_line_reported_by_number(self, journal):
        """A line that is not JSON is named by number; the lines after it are still read."""
        journal.process()
        journal.beat(1.0)
        journal.raw(b'{"v":1,"k":"beat",,}\n')
        journal.beat(2.0)
        j = journal.read()
        assert j.beats == 2
        assert len(j.problems) == 1 and j.problems[0].startswith("line 3: not JSON: ")

    @pytest.mark.parametrize(
        ("record", "problem"),
        [
            ({"v": 1, "k": "x", "ts": 1}, "unknown record kind 'x'"),
            ({"v": 1, "k": "end", "ts": 1}, "'end' record has no 'span_id'"),
            ({"k": "beat", "ts": 1, "steps": 1}, "record has no 'v'"),
            ({"v": 1, "k": "beat", "ts": "soon", "steps": 1}, "'ts' is not an integer: 'soon'"),
            ({"v": 1, "k": "beat", "ts": -1, "steps": 1}, "'ts' out of range: -1"),
            ({"v": 0, "k": "beat", "ts": 1, "steps": 1}, "unknown format version 0"),
            ({"v": 1, "k": "end", "ts": 1, "span_id": "XYZ"}, "'span_id' is not 16 lowercase hex digits: 'XYZ'"),
            ([1, 2], "not a record (a JSON list, not an object)"),
        ],
    )
    def test_invalid_record_reported(self, journal, record, problem):
        """A JSON line that is not a valid record is skipped, with the reason and its line number."""
        journal.process()
        journal.raw(json.dumps(record).encode() + b"\n")
        assert journal.read().problems == [f"line 2: {problem}"]

    def test_nan_is_not_json(self, journal):
        """NaN and Infinity are not JSON and are reported, not read."""
        journal.process()
        journal.raw(b'{"v":1,"k":"beat","ts":NaN,"steps":1}\n')
        assert journal.read().problems == ["line 2: not JSON: NaN is not valid JSON"]

    def test_number_too_large_for_a_float(self, journal):
        """1e400 would read as infinity, which `inspect --json` could not print as JSON: a problem."""
        journal.process()
        journal.raw(b'{"v":1,"k":"beat","ts":%d,"steps":1,"metrics":{"loss":1e400}}\n' % journal.ns(1))
        j = read_journal(journal.path)
        assert j.beats == 0 and j.problems == ["line 2: not JSON: the number 1e400 is out of range"]

    def test_future_version_reported_once(self, journal):
        """Records of a newer format version are read as far as possible, reported once."""
        journal.process()
        for t in (1.0, 2.0):
            journal.raw(json.dumps({"v": 2, "k": "beat", "ts": journal.ns(t), "steps": 1}).encode() + b"\n")
        j = journal.read()
        assert j.beats == 2
        assert j.problems == ["line 2: format version 2 is newer than this reader (1); reading what it can"]

    def test_non_utf8_bytes(self, journal):
        """Undecodable bytes are replaced and reported; the record itself is read."""
        journal.process()
        journal.raw(b'{"v":1,"k":"line","ts":1795990429000000000,"level":"info","msg":"caf\xe9"}\n')
        j = journal.read()
        assert j.lines[0].msg == "caf\ufffd"
        assert j.problems == ["line 2: not valid UTF-8 (undecodable bytes replaced)"]

    def test_surrogate_escapes_survive(self, journal):
        """``\\udcXX`` escapes (non-UTF-8 argv) are read back as the same lone surrogates."""
        journal.process(attrs={"process.command_args": ["train.py", "\udcff"]})
        assert journal.read().root.attrs["process.command_args"] == ["train.py", "\udcff"]

    def test_empty_file(self, journal):
        """An empty journal is no error: no spans, no evidence, no problems."""
        j = journal.read()
        assert (j.spans, j.root, j.last_evidence_ns, j.problems) == ([], None, None, [])

    def test_empty_line_reported(self, journal):
        """A blank line in the middle is reported (the writer never writes one)."""
        journal.process()
        journal.raw(b"\n")
        journal.beat(1.0)
        assert journal.read().problems == ["line 2: empty line"]


class TestUnreadable:
    def test_missing_file(self, tmp_path):
        """A missing journal raises JournalError with a one-line message naming it."""
        with pytest.raises(JournalError, match="no such file") as info:
            read_journal(tmp_path / "nope.otel.jsonl")
        assert "\n" not in str(info.value) and "nope.otel.jsonl" in str(info.value)

    def test_directory(self, tmp_path):
        """A directory is not a journal: JournalError."""
        with pytest.raises(JournalError, match="is a directory"):
            read_journal(tmp_path)

    @pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
    def test_no_permission(self, journal):
        """An unreadable journal raises JournalError, not PermissionError."""
        journal.process()
        journal.path.chmod(0)
        with pytest.raises(JournalError, match="permission denied"):
            journal.read()


class TestProcessState:
    def test_exited(self, journal):
        """An exit record means exited, whatever /proc says."""
        journal.process(alive=True)
        journal.exit(1.0)
        assert process_state(journal.read()) == "exited"

    def test_running(self, journal):
        """Our own pid with our own start ticks is running."""
        journal.process(alive=True)
        assert process_state(journal.read()) == "running"

    def test_reused_pid_is_gone(self, journal):
        """A live pid whose start ticks differ from the journal's is someone else: gone."""
        journal.process(alive=False)
        assert process_state(journal.read()) == "gone"

    @pytest.mark.slow
    def test_without_start_ticks_pid_existence_decides(self, journal):
        """With start_ticks null, a live pid counts as running and a dead one as gone."""
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        )
        for pid, state in ((os.getpid(), "running"), (int(dead.stdout), "gone")):
            journal.path.write_bytes(b"")
            journal.record(
                "start",
                0,
                trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
                span_id="0000000000000001",
                parent_id=None,
                name="process",
                pid=pid,
                start_ticks=None,
                attrs={},
            )
            assert process_state(journal.read()) == state

    @pytest.mark.slow
    def test_comm_with_spaces_and_parentheses(self, tmp_path):
        """The start time is field 22 counted after the *last* ')', so a command named
        ``a) (b c`` is still recognised as the live process it is."""
        odd = tmp_path / "a) (b c"
        odd.write_bytes(Path("/bin/sleep").read_bytes())
        odd.chmod(0o755)
        child = subprocess.Popen([str(odd), "30"])
        try:
            stat = Path(f"/proc/{child.pid}/stat").read_text()
            assert "(a) (b c)" in stat
            ticks = start_ticks_from_stat(stat)
            assert ticks == int(stat.rsplit(")", 1)[1].split()[19])
            path = tmp_path / "j.otel.jsonl"
            path.write_text(
                json.dumps(
                    {
                        "v": 1,
                        "k": "start",
                        "ts": 1,
                        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                        "span_id": "0000000000000001",
                        "parent_id": None,
                        "name": "process",
                        "pid": child.pid,
                        "start_ticks": ticks,
                        "attrs": {},
                    }
                )
                + "\n"
            )
            assert process_state(read_journal(path)) == "running"
        finally:
            child.kill()
            child.wait()

    def test_stat_parsing(self):
        """Malformed stat text gives None; the 20th field after ')' is the start time."""
        fields = " ".join(str(n) for n in range(3, 30))
        assert start_ticks_from_stat(f"42 (x ) y) {fields}") == 22
        assert start_ticks_from_stat("42 (x") is None
        assert start_ticks_from_stat("42 (x) S 1 2") is None


def test_format_duration():
    """Durations read naturally: milliseconds under a second, three digits, whole seconds from 100."""
    cases = {
        0: "0 ms",
        14_000_000: "14 ms",
        400_000_000: "400 ms",
        2_310_000_000: "2.31 s",
        12_300_000_000: "12.3 s",
        45_000_000_000: "45 s",
        312_400_000_000: "312 s",
        -5: "0 ms",
        999_700_000: "1 s",
        50_000: "0.05 ms",
    }
    assert {ns: format_duration(ns) for ns in cases} == cases


@FUZZ
@given(data=st.binary(max_size=600))
def test_fuzz_bytes_never_raise(tmp_path, data):
    """Any bytes at all read without an exception; every problem is one line naming a line."""
    path = tmp_path / "fuzz.otel.jsonl"
    path.write_bytes(data)
    j = read_journal(path)
    assert all("\n" not in p for p in j.problems)
    process_state(j)


@pytest.mark.slow
@FUZZ
@given(text=journal_lines)
def test_fuzz_records_never_raise(tmp_path, text):
    """Random JSON objects built from the record vocabulary read without an exception."""
    path = tmp_path / "fuzz.otel.jsonl"
    path.write_text(text)
    j = read_journal(path)
    assert len({s.span_id for s in j.spans}) == len(j.spans)
    process_state(j)


def test_tail_reads_only_what_was_added_and_bounds_events(journal) -> None:
    """JournalTail: appended records show up on the next read, a partial last line waits for its
    newline, and with max_events a span keeps its first and latest events and counts the rest."""
    from lora_otel.journal.reader import EVENTS_DROPPED, JournalTail

    root = journal.process()
    tail = JournalTail(journal.path, max_events=4)
    assert [s.name for s in tail.read().spans] == ["process"]
    for i in range(10):
        journal.event(root, 0.1 * i, "e%d" % i)
    journal.raw(b'{"v":1,"k":"end","ts":%d,"span_id":"%s","sta' % (journal.ns(2), root.encode()))
    j = tail.read()
    assert [e[1] for e in j.root.events] == ["e0", "e1", "e8", "e9"] and j.root.attrs[EVENTS_DROPPED] == 6
    assert j.root.end_ns is None and not j.problems  # the cut line waits
    journal.raw(b'tus":"ok"}\n')
    j = tail.read()
    assert j.root.end_ns == journal.ns(2) and [s.name for s in tail.take_ended()] == ["process"]
    tail.forget({root})
    assert tail.read().spans == []


def test_tail_survives_copytruncate(journal) -> None:
    """The journal is cut to 0 bytes under the follower (logrotate's copytruncate) while spans are
    open; the writer appends at the new start: the open spans still end, the root is still known,
    nothing read before comes back, and the cut is reported once."""
    from lora_otel.journal.reader import JournalTail

    root = journal.process()
    done = journal.span("first", 0.1, 0.1)
    stage = journal.start("second", 0.3)
    tail = JournalTail(journal.path)
    j = tail.read()
    assert [s.name for s in tail.take_ended()] == ["first"]
    tail.forget({done})
    os.truncate(journal.path, 0)
    journal.end(stage, 0.5)
    journal.span("third", 0.6, 0.1)
    journal.end(root, 1.0)
    j = tail.read()
    assert sorted(s.name for s in tail.take_ended()) == ["process", "second", "third"]
    assert j.root is not None and j.root.span_id == root and j.root.end_ns == journal.ns(1.0)
    assert len(j.problems) == 1 and "cut short while being followed" in j.problems[0]
    assert tail.read().problems == j.problems  # reported once


def test_tail_reads_a_replaced_file_from_the_top(journal, tmp_path) -> None:
    """Another file moved onto the journal's name is read from its start, as a new journal."""
    from lora_otel.journal.reader import JournalTail

    journal.process()
    journal.span("old", 0.1, 0.1)
    tail = JournalTail(journal.path)
    assert {s.name for s in tail.read().spans} == {"process", "old"}
    other = type(journal)(tmp_path / "other.otel.jsonl")
    other.process()
    other.span("new", 0.1, 0.1)
    os.replace(other.path, journal.path)
    j = tail.read()
    assert {s.name for s in j.spans} == {"process", "new"} and j.problems == []


def test_tail_follows_a_file_renamed_by_rotation(journal, tmp_path) -> None:
    """``mv run.otel.jsonl run.otel.jsonl.1`` under the follower (rotation by rename), then a new
    empty file at the name: the follower keeps reading the renamed file, where the writer goes on
    appending; no problem is reported."""
    from lora_otel.journal.reader import JournalTail

    root = journal.process()
    tail = JournalTail(journal.path)
    assert [s.name for s in tail.read().spans] == ["process"]
    os.rename(journal.path, tmp_path / "run.otel.jsonl.1")
    (tmp_path / "run.otel.jsonl").touch()
    journal.path = tmp_path / "run.otel.jsonl.1"  # the writer's descriptor: the renamed file
    journal.span("after", 0.5, 0.1)
    journal.end(root, 1.0)
    j = tail.read()
    assert sorted(s.name for s in tail.take_ended()) == ["after", "process"] and j.problems == []
    tail.close()


def test_a_fifo_or_device_named_like_a_journal_is_refused_not_read(tmp_path) -> None:
    """A FIFO or ``/dev/zero`` behind a ``*.otel.jsonl`` name: one clear error at once (inspect
    and report hung on the FIFO and filled memory from /dev/zero; issue 16's hostile trial)."""
    import os

    import pytest

    from lora_otel.journal.reader import JournalError, read_journal

    fifo = tmp_path / "fifo.otel.jsonl"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.otel.jsonl"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        with pytest.raises(JournalError, match="not a regular file"):
            read_journal(path)
