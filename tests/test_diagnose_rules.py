"""The diagnosis is an ordered list of rules (`diagnose.RULES`): docs/stalls.md's table follows it,
every rule's check answers for its own evidence, and the stall says which rule answered."""

from __future__ import annotations

import re
from pathlib import Path

from lora_otel.analysis.diagnose import RULES, Facts, explain
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import Stall
from lora_otel.journal.records import Span

DOC = Path(__file__).resolve().parent.parent / "docs" / "stalls.md"


def doc_rules() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("| rule | what it is told by |") :].split("\n\n", 1)[0]
    return [m.group(1).strip() for m in re.finditer(r"^\| ([^|]+) \|", table, re.M)][1:]


def test_docs_table_is_the_rule_list_in_order() -> None:
    assert doc_rules() == [rule.name for rule in RULES]


def doc_advice() -> dict[str, str]:
    """The table's last column ("what to do"), by rule."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("| rule | what it is told by |") :].split("\n\n", 1)[0]
    rows = [row for row in table.splitlines()[2:] if row.startswith("| ")]
    return {row.split(" | ", 1)[0][2:].strip(): row.rstrip(" |").rsplit(" | ", 1)[1].strip() for row in rows}


def test_docs_table_says_which_rules_give_advice() -> None:
    """The "what to do" column: an example for every rule that gives advice (`Rule.advice`), "—" for
    each that gives none."""
    told = doc_advice()
    assert set(told) == {rule.name for rule in RULES}
    for rule in RULES:
        assert (told[rule.name] == "\u2014") == (rule.advice == ""), (rule.name, told[rule.name], rule.advice)


def test_rule_names_are_unique_and_cannot_tell_is_last() -> None:
    names = [rule.name for rule in RULES]
    assert len(set(names)) == len(names)
    assert names[-1] == "cannot tell"


def a_stall(kind: str = "alive") -> Stall:
    span = Span("import torch", "a" * 16, None, "b" * 32, 1)
    return Stall(kind, span, 30.0, 5.0, "import torch open for 30 s (limit 5 s)")


def test_the_answering_rule_is_named_on_the_stall() -> None:
    found = explain(a_stall(), {PREFIX + "process.state": "T (stopped)"})
    assert found.sentence.startswith("The process is stopped")
    assert found.attrs["lora_otel.diagnosis.rule"] == "stopped"
    found = explain(a_stall(), {})
    assert found.sentence == "Cannot tell from the evidence."
    assert found.attrs["lora_otel.diagnosis.rule"] == "cannot tell"


def test_the_first_rule_that_answers_wins() -> None:
    """A stopped process with an open connection and huggingface_hub on its stack is stopped."""
    evidence = {
        PREFIX + "process.state": "T (stopped)",
        PREFIX + "python.stacks": (
            "Current thread 0x1 (most recent call first):\n"
            '  File "/usr/lib/python3.11/socket.py", line 707 in readinto\n'
            '  File "/x/huggingface_hub/file_download.py", line 5 in get\n'
        ),
        PREFIX + "net.tcp_connections": ["10.0.0.1:1 -> 10.0.0.2:443 ESTABLISHED"],
    }
    facts = Facts.of(a_stall(), evidence)
    answering = [rule.name for rule in RULES if rule.check(facts) is not None]
    assert answering[0] == "stopped" and "hub download" in answering
    assert explain(a_stall(), evidence).attrs["lora_otel.diagnosis.rule"] == "stopped"


def test_a_wait_in_memory_reclaim_is_memory_not_disk() -> None:
    """A process in D state in `reclaim_throttle` (a memory cgroup at its limit) is slowed by memory,
    though the one sample's major-fault rate is below the threshold (seen in CI: it was called
    "uninterruptible disk I/O"). A D-state wait elsewhere is still disk I/O."""
    evidence = {
        PREFIX + "process.state": "D (disk sleep)",
        PREFIX + "process.wait_channel": "reclaim_throttle",
        PREFIX + "memory.major_faults_per_s": 3.0,
        PREFIX + "process.rss_bytes": 40_000_000,
        PREFIX + "memory.limit_bytes": 50_331_648,
    }
    found = explain(a_stall(), evidence)
    assert found.attrs["lora_otel.diagnosis.rule"] == "memory pressure", found
    assert found.sentence.startswith("Loading is slowed by memory reclaim"), found.sentence
    assert "memory limit of 50 MB" in found.sentence and "wait channel reclaim_throttle" in found.sentence
    found = explain(a_stall(), {**evidence, PREFIX + "process.wait_channel": "io_schedule"})
    assert found.sentence == "The process is in uninterruptible disk I/O (kernel wait channel io_schedule).", found


def test_a_cgroup_at_its_limit_with_faults_is_memory_reclaim() -> None:
    """The CI sample that read "uninterruptible disk I/O": a thrashing load in a 48 MiB cgroup at
    99.5 % of its limit, 32 major faults/s in the 0.5 s sample, the page wait `folio_wait_bit_common`.
    The same wait in a cgroup with room, or with no faults of its own, is disk I/O."""
    evidence = {
        PREFIX + "process.state": "D (uninterruptible (disk) sleep)",
        PREFIX + "process.wait_channel": "folio_wait_bit_common",
        PREFIX + "process.rss_bytes": 29_597_696,
        PREFIX + "memory.major_faults_per_s": 31.9,
        PREFIX + "memory.limit_bytes": 50_331_648,
        PREFIX + "memory.cgroup_usage_bytes": 50_081_792,
        PREFIX + "memory.pressure_some_avg10": 5.84,
    }
    found = explain(a_stall(), evidence)
    assert found.sentence.startswith("Loading is slowed by memory reclaim"), found.sentence
    assert "RSS 30 MB (its cgroup 50 MB) against a memory limit of 50 MB, 32 major page faults/s" in found.sentence
    for change in ({PREFIX + "memory.cgroup_usage_bytes": 30_000_000}, {PREFIX + "memory.major_faults_per_s": 1.0}):
        found = explain(a_stall(), {**evidence, **change})
        assert found.sentence.startswith("The process is in uninterruptible disk I/O"), (change, found.sentence)


def test_a_connect_with_no_answer_names_the_programs_call() -> None:
    """A connect the other side never answers (SYN_SENT) names the address and the program's own
    call before the library frame it waits in (the report, which shows no frames, said only
    `socket.py:836 in create_connection`)."""
    evidence = {
        PREFIX + "process.state": "S (sleeping)",
        PREFIX + "process.wait_channel": "inet_wait_for_connect",
        PREFIX + "net.tcp_connections": ["127.0.0.1:40000 -> 10.0.0.5:443 SYN_SENT"],
        PREFIX + "python.stacks": (
            "Current thread 0x1 (most recent call first):\n"
            '  File "/usr/lib/python3.11/socket.py", line 836 in create_connection\n'
            '  File "/venv/lib/python3.11/site-packages/urllib3/connection.py", line 198 in _new_conn\n'
            '  File "/home/u/job.py", line 13 in <module>\n'
        ),
    }
    found = explain(a_stall(), evidence)
    assert found.sentence.startswith("Connecting to 10.0.0.5:443 with no answer"), found.sentence
    assert " at job.py:13 in <module> → socket.py:836 in create_connection;" in found.sentence, found.sentence


def test_time_sleep_in_select_is_a_sleep() -> None:
    """Python 3.9 and 3.10 sleep in ``select()``: its wait channel with the beat's sample in
    ``time.sleep`` is a sleep (the matrix's 3.10 run said "Cannot tell why" for an atexit handler
    sleeping); the same wait channel without that sample is no sleep."""
    from lora_otel.journal.records import Journal

    journal = Journal(path="/nowhere/1.otel.jsonl")
    journal.main_frames = [["/home/u/job.py", 5, "flush_telemetry"], ["", 0, "time.sleep"]]
    stacks = 'Current thread 0x1 (most recent call first):\n  File "/home/u/job.py", line 5 in flush_telemetry\n'
    for wchan in ("do_select", "poll_schedule_timeout.constprop.0", "hrtimer_nanosleep"):
        evidence = {
            PREFIX + "process.state": "S (sleeping)",
            PREFIX + "process.wait_channel": wchan,
            PREFIX + "python.stacks": stacks,
        }
        found = explain(a_stall(), evidence, journal)
        assert found.sentence.startswith("The main thread is sleeping (time.sleep) at job.py:5 in flush_telemetry"), (
            wchan,
            found.sentence,
        )
    journal.main_frames = [["/home/u/job.py", 5, "flush_telemetry"]]
    found = explain(a_stall(), {**evidence, PREFIX + "process.wait_channel": "do_select"}, journal)
    assert found.attrs["lora_otel.diagnosis.rule"] != "sleeping", found.sentence
