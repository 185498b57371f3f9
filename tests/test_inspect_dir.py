"""``lora-otel inspect DIR`` / ``watch DIR``: the journals of a job side by side, ranks in order, the one
stuck (or failed first, or slowest) called out; ``--summary``: one line per job, exit status by outcome."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest import FUZZ, JournalBuilder, journal_lines
from hypothesis import given
from hypothesis import strategies as st
from procs import lora_otel_cli

from lora_otel.cli import main

OTHER_TRACE = "a" * 32
THIRD_TRACE = "b" * 32


def builder(directory: Path, name: str, number: int, t0: Optional[int] = None) -> JournalBuilder:
    """A journal ``name`` in ``directory`` whose span ids do not collide with the other builders'."""
    journal = JournalBuilder(directory / name, **({} if t0 is None else {"t0": t0}))
    journal._last_id = number << 16
    return journal


def rank_attrs(rank: int, world_size: int = 2, service: str = "train") -> dict[str, Any]:
    return {"service.name": service, "rank": rank, "local_rank": rank, "world_size": world_size}


def inspect(capsys, *args: str) -> tuple[int, list[str], str]:
    """``lora-otel inspect ARGS``: (exit status, stdout lines, stderr)."""
    status = main(["inspect", *args])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def stuck_in_import_job(directory: Path, alive: bool = False, t0: Optional[int] = None) -> None:
    """A launcher and two ranks: rank 0 reaches training, rank 1 never gets past ``import bitsandbytes``.

    The files are named so that rank 1's sorts first, and rank 1 starts first: order by rank is not an accident.
    """
    launcher = builder(directory, "c-launcher.otel.jsonl", 1, t0)
    launch_root = launcher.process(alive=alive, attrs={"service.name": "torchrun"})
    launcher.beat(314.4)
    rank1 = builder(directory, "a-rank1.otel.jsonl", 2, t0)
    rank1.process(0.4, alive=alive, parent_id=launch_root, attrs=rank_attrs(1))
    rank1.span("import torch", 0.5, 1.8)
    rank1.start("import bitsandbytes", 2.4)
    rank1.beat(314.4)
    rank0 = builder(directory, "b-rank0.otel.jsonl", 3, t0)
    rank0.process(0.5, alive=alive, parent_id=launch_root, attrs=rank_attrs(0))
    rank0.span("import torch", 0.6, 1.8)
    rank0.span("import bitsandbytes", 2.5, 0.7)
    rank0.start("training", 3.5)
    rank0.beat(314.4)


def finished_job(directory: Path, name: str, number: int, t: float, trace_id: str, service: str) -> None:
    journal = builder(directory, name, number)
    root = journal.process(t, trace_id=trace_id, attrs={"service.name": service})
    journal.span("training", t + 1.0, 10.0, trace_id=trace_id)
    journal.end(root, t + 12.3)
    journal.exit(t + 12.3)


def failed_job(directory: Path, name: str, number: int, t: float, trace_id: str, service: str) -> None:
    journal = builder(directory, name, number)
    root = journal.process(t, trace_id=trace_id, attrs={"service.name": service})
    load = journal.start("load model", t + 1.0, trace_id=trace_id)
    journal.end(load, t + 1.5, status="error", message="OSError: weights.safetensors not found")
    journal.end(root, t + 1.6, status="error", message="exit code 1")
    journal.exit(t + 1.6, code=1, how="exception", message="OSError: weights.safetensors not found")


def killed_in_training(directory: Path, name: str, number: int, t: float, trace_id: str, service: str) -> None:
    journal = builder(directory, name, number)
    journal.process(t, trace_id=trace_id, attrs={"service.name": service})
    journal.start("training", t + 1.0, trace_id=trace_id)
    journal.beat(t + 601.0, steps=1234, last_step_t=t + 600.8)


def failed_first_job(tmp_path):
    """torchrun with two ranks: rank 1 raises at 18 s, rank 0 is killed just after (no exit record),
    the launcher fails. Returns rank 1's journal builder."""
    launcher = builder(tmp_path, "launcher.otel.jsonl", 1)
    launch_root = launcher.process(attrs={"service.name": "torchrun"})
    launcher.end(launch_root, 21.0, status="error", message="exit code 1")
    launcher.exit(21.0, code=1, how="exception", message="ChildFailedError: train.py FAILED")
    rank0 = builder(tmp_path, "rank0.otel.jsonl", 2)
    rank0.process(0.5, parent_id=launch_root, attrs=rank_attrs(0))
    rank0.start("training", 3.0)
    rank0.beat(17.5, steps=10, last_step_t=17.4)  # its last beat before rank 1's end: killed just after
    rank1 = builder(tmp_path, "rank1.otel.jsonl", 3)
    root1 = rank1.process(0.5, parent_id=launch_root, attrs=rank_attrs(1))
    training = rank1.start("training", 3.0)
    rank1.end(training, 18.0, status="error", message="torch.OutOfMemoryError: CUDA out of memory")
    rank1.end(root1, 18.0, status="error", message="exit code 1")
    rank1.exit(18.0, code=1, how="exception", message="torch.OutOfMemoryError: CUDA out of memory")
    return rank1


class TestOneJob:
    def test_stuck_rank_called_out_and_ranks_in_order(self, capsys, tmp_path):
        """The launcher first, then rank 0, rank 1; rank 1, stuck in its import, is named with its pid,
        and its tree is the one shown."""
        stuck_in_import_job(tmp_path)
        status, lines, err = inspect(capsys, str(tmp_path))
        assert (status, err) == (0, "")
        assert lines[0] == (
            "job 4bf92f3577b34da6a3ce929d0e0e4736  torchrun  3 processes  "
            "killed (no exit record) after stalling at import bitsandbytes for 312 s (rank 1)"
        )
        assert [line.split()[0:2] for line in lines[1:4]] == [["launcher", "pid"], ["rank", "0"], ["rank", "1"]]
        assert lines[3].endswith("0 steps  stuck in import bitsandbytes for 312 s (process gone)")
        callout = next(line for line in lines if "is the one stuck" in line)
        pid = re.search(r"pid (\d+)", lines[3]).group(1)
        assert callout == (
            f"rank 1 (pid {pid}) is the one stuck: in import bitsandbytes for 312 s, then killed (no exit record)"
        )
        tree = lines[lines.index(callout) + 1 :]
        assert tree[0].startswith("    journal: ") and "a-rank1.otel.jsonl" in tree[0]
        assert "      import bitsandbytes  OPEN for 312 s" in tree
        assert "    process  OPEN for 314 s" in tree
        assert tree[-2] == "  (the other 2 processes' trees: --all)"
        assert tree[-1] == f"report: lora-otel report {tmp_path} -o job.html", (
            "a stalled job ends with its report's command"
        )
        assert not any("b-rank0.otel.jsonl" in line for line in lines)

    def test_all_shows_every_tree(self, capsys, tmp_path):
        """--all shows each process's tree under its own heading, in order."""
        stuck_in_import_job(tmp_path)
        lines = inspect(capsys, str(tmp_path), "--all")[1]
        headings = [line for line in lines if re.match(r"  \S.*\(pid \d+\): ", line)]
        assert [h.split(" (pid")[0] for h in headings] == ["  launcher", "  rank 0", "  rank 1"]
        assert sum("journal: " in line for line in lines) == 3
        assert "--all)" not in lines[-1]

    def test_running_job_stalled(self, capsys, tmp_path, monkeypatch):
        """While the ranks run, the one past its import limit is 'stalled at' it: --summary exits 3."""
        for name in ("LORA_OTEL_STALL_AFTER", "LORA_OTEL_FROZEN_AFTER"):
            monkeypatch.delenv(name, raising=False)
        stuck_in_import_job(tmp_path, alive=True, t0=time.time_ns() - 315 * 10**9)
        status, lines, _ = inspect(capsys, str(tmp_path))
        assert status == 0
        assert re.fullmatch(
            r"job \w{32}  torchrun  3 processes  stalled at import bitsandbytes for 3[1-9]\d s \(rank 1\)", lines[0]
        ), lines[0]
        assert any(
            re.fullmatch(r"rank 1 \(pid \d+\) is the one stuck: in import bitsandbytes for 3[1-9]\d s", line)
            for line in lines
        ), lines
        status, lines, _ = inspect(capsys, str(tmp_path), "--summary")
        assert status == 3
        assert re.fullmatch(r"4bf92f35  torchrun  stalled at import bitsandbytes for 3[1-9]\d s \(rank 1\)", lines[0])
        # a higher limit: nothing is stalled yet, the job runs
        status, lines, _ = inspect(capsys, str(tmp_path), "--summary", "--stall-after", "900")
        assert status == 0 and lines[0].startswith("4bf92f35  torchrun  running: ")

    def test_failed_first_is_called_out(self, capsys, tmp_path):
        """Rank 1 raises; rank 0 is then killed and the launcher fails: rank 1 is the one named."""
        rank1 = failed_first_job(tmp_path)
        status, lines, _ = inspect(capsys, str(tmp_path), "--summary")
        assert (status, lines) == (
            1,
            ["4bf92f35  torchrun  failed: torch.OutOfMemoryError: CUDA out of memory (exit code 1, rank 1)"],
        )
        lines = inspect(capsys, str(tmp_path))[1]
        pid = rank1.read().pid
        assert [line for line in lines if " failed first" in line] == [
            f"rank 1 (pid {pid}) failed first: torch.OutOfMemoryError: CUDA out of memory (exit code 1); "
            f"then: rank 0 (pid {pid}) died: killed (no exit record); launcher (pid {pid}) failed: "
            "ChildFailedError: train.py FAILED (exit code 1) (a launcher reporting its children)"
        ]

    def test_killed_together(self, capsys, tmp_path):
        """Ranks killed at once (a scheduler's time limit), none stuck: no rank is 'first'."""
        for rank in (0, 1):
            journal = builder(tmp_path, f"rank{rank}.otel.jsonl", rank + 1)
            journal.process(attrs=rank_attrs(rank))
            journal.start("training", 3.0)
            journal.beat(100.0 + rank, steps=10, last_step_t=99.8)
        lines = inspect(capsys, str(tmp_path))[1]
        assert lines[0].endswith("2 processes  killed (no exit record) in training at step 10 (rank 0)")
        assert lines[3] == (
            f"rank 0 (pid {journal.read().pid}) and 1 other died together: "
            "killed (no exit record) in training at step 10"
        )

    def test_slowest_rank(self, capsys, tmp_path):
        """Running ranks all stepping, one far behind: 'slowest: rank 0 at step 12 while the others are at 40'."""
        t0 = time.time_ns() - 60 * 10**9
        for rank, steps in ((0, 12), (1, 40), (2, 39)):
            journal = builder(tmp_path, f"rank{rank}.otel.jsonl", rank + 1, t0)
            journal.process(alive=True, attrs=rank_attrs(rank, 3))
            journal.start("training", 5.0)
            journal.beat(59.0, steps=steps - 1, last_step_t=58.5)
            journal.beat(59.8, steps=steps, last_step_t=59.6)
        status, lines, _ = inspect(capsys, str(tmp_path))
        assert status == 0
        assert lines[0].endswith("3 processes  running: training step 40 (slowest: rank 0 at step 12)")
        pid = journal.read().pid
        assert f"slowest: rank 0 (pid {pid}) at step 12 while the others are at 39-40" in lines

    def test_lockstep_ranks_have_no_callout(self, capsys, tmp_path):
        """Ranks a step apart are not 'slowest'; a job that finished has no call-out and no tree."""
        t0 = time.time_ns() - 60 * 10**9
        for rank, steps in ((0, 40), (1, 39)):
            journal = builder(tmp_path, f"rank{rank}.otel.jsonl", rank + 1, t0)
            journal.process(alive=True, attrs=rank_attrs(rank))
            journal.start("training", 5.0)
            journal.beat(59.8, steps=steps, last_step_t=59.6)
        lines = inspect(capsys, str(tmp_path))[1]
        assert not any("slowest" in line or "the one" in line for line in lines)
        assert lines[-1] == "  (the processes' trees: --all)"

    def test_children_follow_their_rank(self, capsys, tmp_path):
        """A rank's worker (its journal's parent span is in the rank's journal) comes right after it,
        with the rank's number; a rank missing from the world size is said."""
        launcher = builder(tmp_path, "launcher.otel.jsonl", 1)
        launch_root = launcher.process(attrs={"service.name": "torchrun"})
        roots = {}
        for rank in (1, 0):
            journal = builder(tmp_path, f"rank{rank}.otel.jsonl", rank + 2)
            roots[rank] = journal.process(0.5, parent_id=launch_root, attrs=rank_attrs(rank, 3))
        worker = builder(tmp_path, "worker.otel.jsonl", 9)
        worker.process(0.2, parent_id=roots[0], attrs={"service.name": "train", "lora_otel.activation": "fork"})
        lines = inspect(capsys, str(tmp_path))[1]
        assert [line.split("  pid")[0].strip() for line in lines[1:5]] == [
            "launcher",
            "rank 0",
            "rank 0 child",
            "rank 1",
        ]
        assert lines[5] == "  no journal here for rank 2 of world size 3"

    def test_one_journal_with_summary(self, capsys, journal):
        """--summary works on a single journal: one line; `inspect FILE` alone is unchanged."""
        journal.process()
        journal.start("training", 1.0)
        journal.beat(601.0, steps=1234, last_step_t=600.8)
        status, lines, _ = inspect(capsys, "--summary", str(journal.path))
        assert (status, lines) == (3, ["4bf92f35  train.py  killed (no exit record) in training at step 1234"])
        status, lines, _ = inspect(capsys, str(journal.path))
        assert status == 0 and lines[0].startswith("died in training after 600 s (process gone, 1234 steps")


class TestSummary:
    def test_three_jobs(self, capsys, tmp_path):
        """A finished, a failed and a killed job: one line each by start time (not file name); exit 3."""
        killed_in_training(tmp_path, "a.otel.jsonl", 1, 200.0, THIRD_TRACE, "eval")
        finished_job(tmp_path, "b.otel.jsonl", 2, 0.0, "4bf92f3577b34da6a3ce929d0e0e4736", "train")
        failed_job(tmp_path, "c.otel.jsonl", 3, 100.0, OTHER_TRACE, "finetune")
        status, lines, err = inspect(capsys, str(tmp_path), "--summary")
        assert err == ""
        assert lines == [
            "4bf92f35  train     finished in 12.3 s",
            "aaaaaaaa  finetune  failed: OSError: weights.safetensors not found (exit code 1)",
            "bbbbbbbb  eval      killed (no exit record) in training at step 1234",
        ]
        assert status == 3

    def test_exit_status_by_outcome(self, capsys, tmp_path):
        """All finished: 0; a failed one too: 1."""
        finished_job(tmp_path, "b.otel.jsonl", 2, 0.0, "4bf92f3577b34da6a3ce929d0e0e4736", "train")
        assert inspect(capsys, str(tmp_path), "--summary")[0] == 0
        failed_job(tmp_path, "c.otel.jsonl", 3, 100.0, OTHER_TRACE, "finetune")
        assert inspect(capsys, str(tmp_path), "--summary")[0] == 1
        assert inspect(capsys, str(tmp_path))[0] == 0, "without --summary the status is 0 whatever the outcome"

    def test_killed_by_a_signal_under_lora_otel_run(self, capsys, tmp_path):
        """The exit record `lora-otel run` writes for a signal death is 'killed by SIGKILL'; exit 3."""
        journal = builder(tmp_path, "a.otel.jsonl", 1)
        journal.process()
        journal.start("import bitsandbytes", 0.1)
        journal.exit(5.0, code=137, how="signal", message="killed by SIGKILL")
        status, lines, _ = inspect(capsys, str(tmp_path), "--summary")
        assert (status, lines) == (3, ["4bf92f35  train.py  killed by SIGKILL in import bitsandbytes after 4.9 s"])


class TestJson:
    def test_documented_keys(self, capsys, tmp_path):
        """--json for a directory: jobs with their processes and the call-out, unreadable files."""
        stuck_in_import_job(tmp_path)
        finished_job(tmp_path, "z.otel.jsonl", 9, 400.0, OTHER_TRACE, "eval")
        (tmp_path / "junk.otel.jsonl").write_bytes(b"not a journal\n")
        status, lines, _ = inspect(capsys, str(tmp_path), "--json")
        assert status == 0
        doc = json.loads("\n".join(lines))
        assert set(doc) == {"directory", "jobs", "unreadable", "exit_status"}
        assert doc["exit_status"] == 3 and doc["directory"] == str(tmp_path)
        assert [job["trace_id"] for job in doc["jobs"]] == ["4bf92f3577b34da6a3ce929d0e0e4736", OTHER_TRACE]
        job = doc["jobs"][0]
        assert set(job) == {
            "trace_id",
            "name",
            "start",
            "outcome",
            "summary",
            "status",
            "world_size",
            "missing_ranks",
            "callout",
            "processes",
        }
        assert (job["name"], job["outcome"], job["status"], job["world_size"], job["missing_ranks"]) == (
            "torchrun",
            "killed",
            3,
            2,
            [],
        )
        assert set(job["callout"]) == {"kind", "journal", "pid", "rank", "text"}
        assert (job["callout"]["kind"], job["callout"]["rank"]) == ("stuck", 1)
        assert job["callout"]["journal"].endswith("a-rank1.otel.jsonl")
        processes = job["processes"]
        assert [p["label"] for p in processes] == ["launcher", "rank 0", "rank 1"]
        assert [p["role"] for p in processes] == ["launcher", "rank", "rank"]
        for p in processes:
            assert set(p) == {
                "journal",
                "trace_id",
                "pid",
                "process_state",
                "stuck",
                "main_thread",
                "exit",
                "steps",
                "problems",
                "stalls",
                "rank",
                "local_rank",
                "world_size",
                "role",
                "label",
                "parent_pid",
                "start",
                "outcome",
                "stall",
            }
        assert processes[2]["stall"]["span"] == "import bitsandbytes"
        assert processes[2]["stall"]["kind"] == "alive" and processes[2]["stall"]["limit_s"] == 120
        assert processes[1]["parent_pid"] == processes[0]["pid"]
        assert doc["jobs"][1]["callout"] is None and doc["jobs"][1]["summary"] == "finished in 12.3 s"
        assert doc["unreadable"] == [
            {
                "journal": str(tmp_path / "junk.otel.jsonl"),
                "reason": "not a journal (line 1: not JSON: Expecting value (column 1))",
            }
        ]

    def test_all_adds_spans(self, capsys, tmp_path):
        stuck_in_import_job(tmp_path)
        doc = json.loads("\n".join(inspect(capsys, str(tmp_path), "--json", "--all")[1]))
        rank1 = doc["jobs"][0]["processes"][2]
        assert [span["name"] for span in rank1["spans"]] == ["process", "import torch", "import bitsandbytes"]


class TestBadInput:
    def test_empty_directory(self, capsys, tmp_path):
        """No journals: exit 2 and one line on stderr, nothing on stdout, with or without --summary."""
        for flags in ([], ["--summary"], ["--json"]):
            status, lines, err = inspect(capsys, str(tmp_path), *flags)
            assert (status, lines) == (2, [])
            assert err == f"lora-otel inspect: {tmp_path}: no journals (*.otel.jsonl) in this directory\n"

    def test_corrupt_and_empty_journals_are_reported(self, capsys, tmp_path):
        """A file of garbage and an empty file are listed, not fatal; a journal with a corrupt line
        joins its job with its problem count."""
        finished_job(tmp_path, "b.otel.jsonl", 2, 0.0, "4bf92f3577b34da6a3ce929d0e0e4736", "train")
        with open(tmp_path / "b.otel.jsonl", "ab") as f:
            f.write(b"\x00\x00garbage\n")
        (tmp_path / "garbage.otel.jsonl").write_bytes(b"\xff\xfe{{{\n")
        (tmp_path / "empty.otel.jsonl").write_bytes(b"")
        (tmp_path / "notes.txt").write_text("not a journal by name, not read\n")
        status, lines, err = inspect(capsys, str(tmp_path))
        assert (status, err) == (0, "")
        assert lines[1].endswith("finished normally in 12.3 s (exit code 0)  [1 journal problem]")
        assert f"not read: {tmp_path / 'empty.otel.jsonl'}: empty journal: no records" in lines
        assert any(
            line.startswith(f"not read: {tmp_path / 'garbage.otel.jsonl'}: not a journal (line 1: ") for line in lines
        )
        assert not any("notes.txt" in line for line in lines)
        status, lines, _ = inspect(capsys, str(tmp_path), "--summary")
        assert status == 0, "an unreadable file is listed but does not count"
        assert lines[0] == "4bf92f35  train  finished in 12.3 s"
        assert lines[1:] == ["????????  empty.otel.jsonl  not read: empty journal: no records", lines[2]] and lines[
            2
        ].startswith("????????  garbage.otel.jsonl  not read: not a journal")

    def test_only_garbage(self, capsys, tmp_path):
        """A directory of nothing but a corrupt journal: reported, exit 0 (nothing failed that we know of)."""
        (tmp_path / "x.otel.jsonl").write_bytes(b"garbage\n")
        status, lines, _ = inspect(capsys, str(tmp_path), "--summary")
        assert status == 0 and len(lines) == 1 and "not read: not a journal" in lines[0]

    def test_bad_stall_after(self, capsys, tmp_path):
        stuck_in_import_job(tmp_path)
        status, lines, err = inspect(capsys, str(tmp_path), "--stall-after", "import=soon")
        assert status == 2 and lines == [] and err.startswith("lora-otel inspect: --stall-after: ")

    def test_span_ids_shared_between_journals(self, capsys, tmp_path):
        """Journals that reuse each other's span ids (only hand-made ones do) do not confuse the parents."""
        for rank in (1, 0):
            journal = JournalBuilder(tmp_path / f"r{rank}.otel.jsonl")
            journal.process(parent_id="0000000000000002", attrs=rank_attrs(rank))
            journal.span("arguments", 0.1, 0.1)  # span 0000…0002 in both journals
            journal.exit(1.0)
        lines = inspect(capsys, str(tmp_path))[1]
        assert [line.split("  pid")[0].strip() for line in lines[1:3]] == ["rank 0", "rank 1"]


@pytest.mark.slow
@FUZZ
@given(
    first=journal_lines,
    second=st.binary(max_size=200) | journal_lines.map(str.encode),
    flags=st.sampled_from([[], ["--summary"], ["--json"], ["--all"]]),
)
def test_fuzz_directory_never_fails(tmp_path, capsys, first, second, flags):
    """Whatever the journals hold, inspect DIR answers with an outcome status (or valid JSON), no exception."""
    for old in tmp_path.glob("*.otel.jsonl"):
        old.unlink()
    (tmp_path / "one.otel.jsonl").write_text(first, encoding="utf-8")
    (tmp_path / "two.otel.jsonl").write_bytes(second)
    status = main(["inspect", *flags, str(tmp_path)])
    out, _ = capsys.readouterr()
    assert status in ((0, 1, 3) if flags == ["--summary"] else (0,))
    if flags == ["--json"]:
        json.loads(out)
    assert out


class TestWatch:
    def test_once_groups_the_job(self, capsys, tmp_path):
        """watch DIR --once: the job heading, ranks in order, the stuck rank called out with its tree only."""
        stuck_in_import_job(tmp_path)
        status = main(["watch", "--once", str(tmp_path)])
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert status == 3
        assert lines[0].startswith("job 4bf92f3577b34da6a3ce929d0e0e4736  torchrun  3 processes  killed ")
        assert [line.split("  pid")[0].strip() for line in lines[1:4]] == ["launcher", "rank 0", "rank 1"]
        assert lines[4].startswith("rank 1 (pid ") and "is the one stuck: in import bitsandbytes for 312 s" in lines[4]
        assert re.fullmatch(r"rank 1, pid \d+: gone", lines[6])
        assert "  import bitsandbytes  OPEN for 312 s" in lines
        assert lines[-2] == f"(the other 2 processes' trees: lora-otel inspect {tmp_path} --all)"
        assert lines[-1] == f"report: lora-otel report {tmp_path} -o job.html", (
            "a stalled job ends with its report's command"
        )
        assert "training  OPEN" not in out, "rank 0's tree is not shown"

    def test_exit_status_is_the_jobs_as_inspect_summary_says(self, capsys, tmp_path):
        """Rank 1 failed first and rank 0 was then killed: watch exits 1 (failed), as
        `inspect --summary` does, not 3 for the rank its launcher killed."""
        failed_first_job(tmp_path)
        assert main(["watch", "--once", str(tmp_path)]) == 1
        capsys.readouterr()
        assert inspect(capsys, str(tmp_path), "--summary")[0] == 1

    def test_line_mode_names_ranks_and_the_callout(self, capsys, tmp_path):
        """Out of a terminal: each line names the pid and rank; the call-out is a line of its own."""
        stuck_in_import_job(tmp_path)
        main(["watch", "--interval", "0.1", str(tmp_path)])
        lines = capsys.readouterr().out.splitlines()
        following = [line for line in lines if " following " in line]
        assert [re.sub(r"\d+", "N", line.split(" following")[0]) for line in following] == [
            "[watch] N (launcher)",
            "[watch] N (rank N)",
            "[watch] N (rank N)",
        ]
        assert "(rank 0) following" in following[1] and "(rank 1) following" in following[2]
        [callout] = [line for line in lines if line.startswith("[watch] job ")]
        assert re.fullmatch(
            r"\[watch\] job 4bf92f35: rank 1 \(pid \d+\) is the one stuck: in import bitsandbytes "
            r"for 312 s, then killed \(no exit record\)",
            callout,
        )
        assert lines.index(callout) < lines.index("[watch] every process has ended")


@pytest.mark.slow
def test_help_documents_the_directory_and_exit_statuses() -> None:
    r = lora_otel_cli("inspect", "--help")
    assert r.returncode == 0
    assert "lora-otel inspect runs/ --summary" in r.stdout
    assert "3 some killed or stalled" in r.stdout and "--all" in r.stdout
