"""``lora-otel inspect``: the first line says where the process is or was stuck; then the tree."""

from __future__ import annotations

import json
import re
import time

import pytest
from conftest import FUZZ, journal_lines
from hypothesis import given
from hypothesis import strategies as st

from lora_otel.cli import main
from lora_otel.cli.inspect import render_text

ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def inspect(capsys, journal, *flags: str) -> tuple[int, list[str], str]:
    """Run ``lora-otel inspect`` on the journal: (exit status, stdout lines, stderr)."""
    status = main(["inspect", *flags, str(journal.path)])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def inspect_json(capsys, journal) -> dict:
    status, lines, _ = inspect(capsys, journal, "--json")
    assert status == 0
    return json.loads("\n".join(lines))


def killed_in_import(journal) -> None:
    """A process killed 312 s into ``import bitsandbytes``, after torch imported in 2.3 s."""
    journal.process(alive=False)
    journal.span("arguments", 0.001, 0.0002)
    torch = journal.start("import torch", 0.01)
    journal.end(torch, 2.31, attrs={"lora_otel.package.version": "2.13.0"})
    journal.start("import bitsandbytes", 2.4)
    journal.beat(3.0)
    journal.beat(314.4)


class TestFirstLine:
    def test_killed_in_import(self, capsys, journal):
        """The open import under the process is named, open for last-evidence minus its start."""
        killed_in_import(journal)
        status, lines, err = inspect(capsys, journal)
        assert status == 0 and err == ""
        assert lines[0] == "stuck in import bitsandbytes for 312 s (process gone)"

    def test_finished_normally(self, capsys, journal):
        """An exit record with code 0 and every span closed: finished, with the lifetime."""
        root = journal.process()
        journal.span("training", 1.0, 10.0)
        journal.end(root, 12.29)
        journal.exit(12.3)
        assert inspect(capsys, journal)[1][0] == "finished normally in 12.3 s (exit code 0)"

    def test_failed(self, capsys, journal):
        """A non-zero exit says the exit message and code."""
        root = journal.process()
        load = journal.start("load model", 1.0)
        journal.end(load, 1.5, status="error", message="OSError: weights.safetensors not found")
        journal.end(root, 1.6, status="error", message="exit code 1")
        journal.exit(1.6, code=1, how="exception", message="OSError: weights.safetensors not found")
        assert inspect(capsys, journal)[1][0] == "failed: OSError: weights.safetensors not found (exit code 1)"

    def test_failed_with_only_a_code(self, capsys, journal):
        """An exit message that only repeats the code is not repeated; a failed stage is named instead."""
        root = journal.process()
        journal.end(root, 1.0, status="error", message="exit code 3")
        journal.exit(1.0, code=3, message="exit code 3")
        assert inspect(capsys, journal)[1][0] == "failed with exit code 3"

    def test_failed_stage_named_when_exit_says_only_the_code(self, capsys, journal):
        """With only the code in the exit record, the last failed stage's message is given."""
        root = journal.process()
        load = journal.start("load model", 1.0)
        journal.end(load, 1.5, status="error", message="OSError: EIO")
        journal.end(root, 2.0, status="error", message="exit code 1")
        journal.exit(2.0, code=1, message="exit code 1")
        assert inspect(capsys, journal)[1][0] == "failed: load model: OSError: EIO (exit code 1)"

    def test_died_while_training(self, capsys, journal):
        """A gone process whose steps advanced until the journal ends died in training, not stuck."""
        journal.process()
        journal.start("training", 1.0)
        journal.beat(3601.0, steps=1200, last_step_t=3600.6)
        assert inspect(capsys, journal)[1][0] == (
            "died in training after 3600 s (process gone, 1200 steps, last step 400 ms before the journal ends)"
        )

    def test_running_and_stuck(self, capsys, journal):
        """A live process in ``cuda init`` past its 120 s limit: stuck for now minus the span's start."""
        journal.t0 = time.time_ns() - 131 * 10**9
        journal.process(alive=True)
        journal.span("import torch", 0.0, 1.0)
        journal.start("cuda init", 1.0)
        journal.beat(130.5)
        first = inspect(capsys, journal)[1][0]
        # the durations are now minus a start; a loaded machine's slow call only adds to them
        assert re.fullmatch(r"stuck in cuda init for 1[3-9]\d s \(process running\)", first), first

    def test_running_within_its_limit(self, capsys, journal):
        """A live process 45 s into ``cuda init`` (limit 120 s) is still in it, not stuck."""
        journal.t0 = time.time_ns() - 46 * 10**9
        journal.process(alive=True)
        journal.span("import torch", 0.0, 1.0)
        journal.start("cuda init", 1.0)
        journal.beat(45.5)
        first = inspect(capsys, journal)[1][0]
        assert re.fullmatch(r"still in cuda init for [4-9]\d s \(process running(, no beat for \d+ s)?\)", first), first

    def test_running_and_frozen(self, capsys, journal):
        """A live process whose beats stopped says how long there has been no beat."""
        journal.t0 = time.time_ns() - 100 * 10**9
        journal.process(alive=True)
        journal.start("cuda init", 1.0)
        journal.beat(2.0)
        first = inspect(capsys, journal)[1][0]
        assert re.fullmatch(
            r"stuck in cuda init for (99|1\d\d) s \(process running, no beat for (98|99|1\d\d) s\)", first
        ), first

    def test_training_advancing(self, capsys, journal):
        """Training with a recent step is 'still in', with the step count and the last step's age."""
        journal.t0 = time.time_ns() - 20 * 10**9
        journal.process(alive=True)
        journal.start("training", 0.0)
        journal.beat(19.6, steps=1200, last_step_t=19.6)
        first = inspect(capsys, journal)[1][0]
        assert re.fullmatch(
            r"still in training for [2-9]\d(\.\d)? s \(process running(, no beat for \d+ s)?, 1200 steps,"
            r" last step (\d+ ms|\d+(\.\d)? s) ago\)",
            first,
        ), first

    def test_only_process_open(self, capsys, journal):
        """Gone between stages: nothing but the process span open."""
        journal.process()
        journal.span("training", 1.0, 2.0)
        journal.beat(5.0)
        assert inspect(capsys, journal)[1][0] == "ended with spans open: process (process gone)"

    def test_exit_with_spans_open(self, capsys, journal):
        """An exit record while spans are still open names them."""
        journal.process()
        journal.start("training", 1.0)
        journal.exit(5.0, code=None, how="signal")
        assert inspect(capsys, journal)[1][0] == "ended with spans open: process, training (no exit code)"

    def test_empty_file(self, capsys, journal):
        """An empty journal is reported as such, exit 0."""
        status, lines, _ = inspect(capsys, journal)
        assert status == 0 and lines[0] == "empty journal: no records"


class TestTree:
    def test_tree_and_marks(self, capsys, journal):
        """Children are indented under their parent in start order, with durations, status marks,
        OPEN marks and the package version of imports."""
        killed_in_import(journal)
        lines = inspect(capsys, journal)[1]
        assert lines[2:7] == [
            "process  OPEN for 314 s",
            "  arguments  0.2 ms  ok",
            "  import torch  2.3 s  ok  package.version=2.13.0",
            "  import bitsandbytes  OPEN for 312 s",
            "beats: 2, steps: 0",
        ]

    def test_nested_and_error(self, capsys, journal):
        """A grandchild is indented twice; an error span shows its message."""
        journal.process()
        load = journal.start("load model", 1.0)
        shard = journal.start("read shard", 1.1, parent=load)
        journal.end(shard, 1.2, status="error", message="EIO")
        lines = inspect(capsys, journal)[1]
        assert "    read shard  100 ms  ERROR: EIO" in lines
        assert lines.index("  load model  OPEN for 200 ms") < lines.index("    read shard  100 ms  ERROR: EIO")

    def test_control_characters_escaped(self, capsys, journal):
        """Names and messages cannot inject terminal escapes or break lines."""
        journal.process()
        journal.start("evil\x1b[2J\nname", 1.0)
        lines = inspect(capsys, journal)[1]
        assert lines[0] == "stuck in evil\\x1b[2J\\nname for 0 ms (process gone)"
        assert not any("\x1b" in line for line in lines)


class TestProblems:
    def test_truncated_last_line(self, capsys, journal):
        """A truncated last record is noted; the rest is shown."""
        killed_in_import(journal)
        journal.raw(b'{"v":1,"k":"beat","ts":17959')
        lines = inspect(capsys, journal)[1]
        assert lines[0].startswith("stuck in import bitsandbytes")
        assert lines[-1] == "note: line 9: truncated (incomplete last record)"

    def test_corrupt_middle_line(self, capsys, journal):
        """A corrupt line is noted by its number."""
        journal.process()
        journal.raw(b"\x00\x00\x00garbage\n")
        journal.beat(1.0)
        notes = [line for line in inspect(capsys, journal)[1] if line.startswith("note: ")]
        assert len(notes) == 1 and notes[0].startswith("note: line 2: not JSON: ")

    def test_non_utf8(self, capsys, journal):
        """Undecodable bytes are noted and shown replaced; output stays valid text."""
        journal.process()
        journal.raw(
            b'{"v":1,"k":"start","ts":1795990429000000000,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736",'
            b'"span_id":"00000000000000aa","parent_id":"0000000000000001",'
            b'"name":"import caf\xe9","attrs":{}}\n'
        )
        lines = inspect(capsys, journal)[1]
        assert lines[0] == "stuck in import caf\ufffd for 0 ms (process gone)"
        assert "note: line 2: not valid UTF-8 (undecodable bytes replaced)" in lines

    def test_missing_file(self, capsys, tmp_path):
        """A missing journal: exit 2, one line on stderr, no traceback, nothing on stdout."""
        status = main(["inspect", str(tmp_path / "nope.otel.jsonl")])
        out, err = capsys.readouterr()
        assert status == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith("lora-otel inspect: ") and "Traceback" not in err

    def test_directory(self, capsys, tmp_path):
        """A directory given as the journal: exit 2, one line."""
        assert main(["inspect", str(tmp_path)]) == 2
        assert capsys.readouterr().err.count("\n") == 1


class TestJson:
    def test_schema(self, capsys, journal):
        """--json has the documented keys; times are ISO-8601 UTC with milliseconds; open spans have
        end null, status "open" and open_for_s."""
        killed_in_import(journal)
        doc = inspect_json(capsys, journal)
        assert set(doc) == {
            "journal",
            "trace_id",
            "pid",
            "process_state",
            "stuck",
            "main_thread",
            "exit",
            "steps",
            "stall",
            "problems",
            "stalls",
            "spans",
        }
        assert doc["main_thread"] is None  # its beats (none here) did not say where the main thread was
        assert doc["stuck"] == "stuck in import bitsandbytes for 312 s (process gone)"
        assert (doc["process_state"], doc["exit"], doc["steps"], doc["problems"]) == ("gone", None, 0, [])
        assert doc["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
        spans = {span["name"]: span for span in doc["spans"]}
        for span in doc["spans"]:
            assert set(span) == {
                "name",
                "span_id",
                "parent_id",
                "start",
                "end",
                "status",
                "message",
                "attributes",
                "events",
                "open_for_s",
            }
            assert ISO_MS.fullmatch(span["start"])
        assert spans["process"]["start"] == "2026-11-29T22:13:48.000Z"
        bnb = spans["import bitsandbytes"]
        assert (bnb["end"], bnb["status"], bnb["open_for_s"]) == (None, "open", 312.0)
        torch = spans["import torch"]
        assert (torch["end"], torch["status"], torch["open_for_s"]) == ("2026-11-29T22:13:50.310Z", "ok", None)
        assert torch["attributes"]["lora_otel.package.version"] == "2.13.0"
        assert torch["parent_id"] == spans["process"]["span_id"]

    def test_exit_and_events(self, capsys, journal):
        """The exit record and span events appear with ISO times."""
        root = journal.process()
        journal.event(root, 0.5, "mark", {"note": "here"})
        journal.end(root, 1.0)
        journal.exit(1.0, code=0)
        doc = inspect_json(capsys, journal)
        assert doc["exit"] == {"ts": "2026-11-29T22:13:49.000Z", "code": 0, "how": "normal", "message": None}
        assert doc["spans"][0]["events"] == [
            {"name": "mark", "time": "2026-11-29T22:13:48.500Z", "attributes": {"note": "here"}}
        ]

    def test_lone_surrogates_stay_json(self, capsys, journal):
        """Non-UTF-8 argv (lone surrogates) comes out as \\udcXX escapes in valid JSON."""
        journal.process(attrs={"process.command_args": ["train.py", "\udcff"]})
        doc = inspect_json(capsys, journal)
        assert doc["spans"][0]["attributes"]["process.command_args"] == ["train.py", "\udcff"]


def test_render_text_is_the_command_output(capsys, journal):
    """``render_text`` (used by ``lora-otel run`` at the end) gives exactly what ``inspect`` prints."""
    killed_in_import(journal)
    _, lines, _ = inspect(capsys, journal)
    assert render_text(journal.read()) == "\n".join(lines) + "\n"


@pytest.mark.slow
@FUZZ
@given(data=st.binary(max_size=400) | journal_lines.map(str.encode), as_json=st.booleans())
def test_fuzz_inspect_never_fails(tmp_path, capsys, data, as_json):
    """Whatever the journal holds, inspect exits 0 with a first line (or valid JSON), no exception;
    or, when not one line was a journal record, 2 with one "not a journal" line on stderr."""
    path = tmp_path / "fuzz.otel.jsonl"
    path.write_bytes(data)
    status = main(["inspect", *(["--json"] if as_json else []), str(path)])
    out, err = capsys.readouterr()
    if status == 2:
        assert not out and err.count("not a journal") == 1 and len(err.splitlines()) == 1
        return
    assert status == 0
    if as_json:
        assert json.loads(out)["stuck"]
    else:
        assert out.splitlines()[0]


def test_a_log_with_no_journal_beside_it_says_where_the_journal_went(tmp_path, capsys, monkeypatch):
    """``inspect runs/demo.log`` when the run could not write its journal beside the log (``runs/``
    did not exist as it started, a newcomer's first run): one line that says so and where the
    journal went, not only "not a journal (line 1: not JSON)"."""
    state = tmp_path / "state"
    monkeypatch.delenv("LORA_OTEL_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    log = tmp_path / "demo.log"
    log.write_text("step 1 loss 2.0\n")
    status = main(["inspect", str(log)])
    out, err = capsys.readouterr()
    assert status == 2 and not out and len(err.splitlines()) == 1, err
    assert "no journal beside it (%s.otel.jsonl)" % log in err, err
    assert str(state / "lora-otel") in err and "with no argument reads the newest run there" in err, err
