"""The thread deadlock rule (`lora_otel.analysis.threadwaits`) over recorded evidence, in
milliseconds: the real runs under tests/data/evidence/thread_deadlock_*.json (a thread joined at
import that imports its module, written by tests/test_thread_deadlock.py; datasets' map with a pool
at import), the same stacks with one fact taken away (no cycle: no deadlock, no advice), and
stacks made here for the waits the real runs do not cover."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lora_otel.analysis import threadwaits
from lora_otel.analysis.diagnose import Diagnosis, _threads, explain
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import Stall
from lora_otel.journal.records import Span

CASES = sorted((Path(__file__).resolve().parent / "data" / "evidence").glob("thread_deadlock_*.json"))
STACKS = PREFIX + "python.stacks"


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def run(case: dict, evidence: dict) -> Diagnosis:
    stall = case["stall"]
    span = Span(stall["stage"], "a" * 16, None, "b" * 32, 1)
    return explain(
        Stall(stall["kind"], span, stall["open_for_s"], stall["limit_s"], ""), evidence, now_ns=case["now_ns"]
    )


def rule(found: Diagnosis) -> str:
    return str(found.attrs["lora_otel.diagnosis.rule"])


def test_there_are_recorded_cases() -> None:
    assert len(CASES) >= 2


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_rule_over_recorded_evidence(path: Path) -> None:
    case = load(path)
    found = run(case, case["evidence"])
    expect = case["expect"]
    assert rule(found) == expect["rule"], found.sentence
    for pattern in expect["sentence"]:  # regexes, as in every recorded case (tests/evidence_cases.py)
        assert re.search(pattern, found.sentence), (pattern, found.sentence)
    for pattern in expect["advice"]:
        assert re.search(pattern, found.advice), (pattern, found.advice)
    assert found.attrs.get("lora_otel.diagnosis.advice") == found.advice
    assert "acquire" not in found.sentence and "_wait_for_tstate_lock" not in found.sentence
    if "diagnosis" in case:
        assert found.sentence == case["diagnosis"]  # the same words as the real run's


def _without_thread(stacks: str, marker: str) -> str:
    """The dump without the thread whose frames contain ``marker``."""
    blocks = stacks.replace("\nThread ", "\n\0Thread ").split("\n\0")
    return "\n".join(b for b in blocks if marker not in b)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_without_the_thread_that_waits_for_the_import_there_is_no_deadlock(path: Path) -> None:
    case = load(path)
    stacks = _without_thread(case["evidence"][STACKS], "_lock_unlock_module")
    found = run(case, {**case["evidence"], STACKS: stacks})
    assert rule(found) != "thread deadlock" and "Deadlock" not in found.sentence, found.sentence


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_when_the_main_thread_is_not_importing_there_is_no_deadlock(path: Path) -> None:
    """The waiter's module lock is held by no thread the stacks show: no edge, no cycle."""
    case = load(path)
    stacks = case["evidence"][STACKS].replace(" line 241 in _call_with_frames_removed", " line 241 in elsewhere")
    stacks = stacks.replace("<frozen importlib._bootstrap", "/work/job/loader.py<")
    found = run(case, {**case["evidence"], STACKS: stacks})
    assert rule(found) != "thread deadlock", found.sentence


# --- stacks made here ---------------------------------------------------------------------------

THREADING = "/usr/lib/python3.11/threading.py"
BOOT = "<frozen importlib._bootstrap>"


def dump(*threads: list[tuple[str, int, str]]) -> str:
    out = []
    for i, frames in enumerate(threads):
        out.append("%s 0x%016x (most recent call first):" % ("Current thread" if i == 0 else "Thread", 100 + i))
        out += ['  File "%s", line %d in %s' % f for f in frames]
    return "\n".join(out) + "\n"


IMPORTING_MAIN = [
    (BOOT, 241, "_call_with_frames_removed"),
    ("<frozen importlib._bootstrap_external>", 940, "exec_module"),
    (BOOT, 690, "_load_unlocked"),
    (BOOT, 1147, "_find_and_load_unlocked"),
    (BOOT, 1176, "_find_and_load"),
    ("/work/job/train.py", 3, "<module>"),
]
IMPORT_WAIT = [(BOOT, 120, "acquire"), (BOOT, 224, "_lock_unlock_module"), (BOOT, 1170, "_find_and_load")]
THREAD_RUN = [(THREADING, 982, "run"), (THREADING, 1045, "_bootstrap_inner"), (THREADING, 1002, "_bootstrap")]
JOIN = [(THREADING, 1139, "_wait_for_tstate_lock"), (THREADING, 1119, "join")]


def explain_stacks(stacks: str) -> Diagnosis:
    span = Span("import plugins", "a" * 16, None, "b" * 32, 1)
    evidence = {
        STACKS: stacks,
        PREFIX + "process.state": "S (sleeping)",
        PREFIX + "process.wait_channel": "futex_do_wait",
    }
    return explain(Stall("alive", span, 30.0, 5.0, ""), evidence)


def test_an_executor_future_waited_at_import_whose_task_imports_the_module() -> None:
    stacks = dump(
        [
            (THREADING, 320, "wait"),
            ("/usr/lib/python3.11/concurrent/futures/_base.py", 451, "result"),
            ("/work/job/plugins/__init__.py", 9, "<module>"),
            *IMPORTING_MAIN,
        ],
        [
            *IMPORT_WAIT,
            ("/work/job/plugins/extra.py", 4, "register"),
            ("/usr/lib/python3.11/concurrent/futures/thread.py", 58, "run"),
            ("/usr/lib/python3.11/concurrent/futures/thread.py", 83, "_worker"),
            *THREAD_RUN,
        ],
    )
    found = explain_stacks(stacks)
    assert rule(found) == "thread deadlock", found.sentence
    assert found.sentence.startswith(
        "Deadlock between threads: the main thread, importing plugins, waits at __init__.py:9 in <module> for its "
        "pool's results, which depend on thread register(), a worker thread of its ThreadPoolExecutor; "
        "thread register() waits at extra.py:4 in register for the import of plugins, which the main thread is running"
    ), found.sentence
    assert "move the work at __init__.py:9 (the top level of plugins" in found.advice, found.advice


def test_a_join_with_two_threads_it_could_join_names_none() -> None:
    """Which thread ``t.join()`` joins is not in the stacks when two could be: no edge, no deadlock."""
    waiter = [*IMPORT_WAIT, ("/work/job/bar.py", 2, "baz"), *THREAD_RUN]
    other = [("/usr/lib/python3.11/socket.py", 700, "recv"), ("/work/job/net.py", 5, "serve"), *THREAD_RUN]
    main = [*JOIN, ("/work/job/foo.py", 6, "<module>"), *IMPORTING_MAIN]
    found = explain_stacks(dump(main, waiter, other))
    assert rule(found) != "thread deadlock", found.sentence
    assert rule(explain_stacks(dump(main, waiter))) == "thread deadlock"


def test_the_exit_join_is_not_a_thread_join() -> None:
    main = [(THREADING, 1583, "_shutdown")]
    waiter = [*IMPORT_WAIT, ("/work/job/bar.py", 2, "baz"), *THREAD_RUN]
    assert threadwaits.edges(_threads(dump(main, waiter))) == []


def test_a_cycle_of_joins_alone_gives_no_advice() -> None:
    """A thread joining the main thread while the main thread joins it: a deadlock without an import,
    for which the evidence names no single line to move."""
    main = [*JOIN, ("/work/job/train.py", 9, "<module>")]
    worker = [*JOIN, ("/work/job/train.py", 4, "work"), *THREAD_RUN]
    found = explain_stacks(dump(main, worker))
    assert rule(found) == "thread deadlock", found.sentence
    assert found.sentence == (
        "Deadlock between threads: the main thread waits at train.py:9 in <module> for thread work() to end "
        "(Thread.join); thread work() waits at train.py:4 in work for the main thread to end (Thread.join); "
        "neither can go on."
    )
    assert found.advice == ""


def test_the_module_named_by_the_waiters_source_line(tmp_path: Path) -> None:
    """With the source readable, the module the waiter imports is its ``import`` line's; a thread
    importing another module holds not that lock: no edge."""
    (tmp_path / "bar.py").write_text("def baz():\n    import other\n", encoding="utf-8")
    waiter = [*IMPORT_WAIT, (str(tmp_path / "bar.py"), 2, "baz"), *THREAD_RUN]
    main = [*JOIN, ("/work/job/foo.py", 6, "<module>"), *IMPORTING_MAIN]

    def source(line: str):
        return lambda frame: line if getattr(frame, "func", "") == "baz" else ""

    threads = _threads(dump(main, waiter))
    assert [(e.kind, e.module) for e in threadwaits.edges(threads, source("    import other\n"))] == [("join", "")]
    found = threadwaits.edges(threads, source("    from foo.sub import x\n"))
    assert sorted((e.kind, e.module) for e in found) == [("import", "foo.sub"), ("join", "")], found


def test_an_event_waited_at_import_for_the_only_thread_that_could_set_it() -> None:
    main = [
        (THREADING, 331, "wait"),
        (THREADING, 629, "wait"),
        ("/work/job/plugins/__init__.py", 7, "<module>"),
        *IMPORTING_MAIN,
    ]
    worker = [*IMPORT_WAIT, ("/work/job/plugins/loader.py", 3, "load"), *THREAD_RUN]
    found = explain_stacks(dump(main, worker))
    assert rule(found) == "thread deadlock", found.sentence
    assert (
        "the main thread, importing plugins, waits at __init__.py:7 in <module> in Event.wait() for thread load(), "
        "the only other thread that could set or fill what it waits on" in found.sentence
    ), found.sentence
    assert "move the work at __init__.py:7 (the top level of plugins" in found.advice
    other = [("/usr/lib/python3.11/socket.py", 700, "recv"), ("/work/job/net.py", 5, "serve"), *THREAD_RUN]
    assert rule(explain_stacks(dump(main, worker, other))) != "thread deadlock"


def test_an_executors_own_join_is_a_wait_for_its_workers_not_for_another_thread() -> None:
    """``shutdown(wait=True)`` joins the executor's workers: not the one other thread of the program."""
    main = [
        *JOIN,
        ("/usr/lib/python3.11/concurrent/futures/thread.py", 235, "shutdown"),
        ("/work/job/plugins/__init__.py", 8, "<module>"),
        *IMPORTING_MAIN,
    ]
    worker = [
        *IMPORT_WAIT,
        ("/work/job/plugins/extra.py", 4, "register"),
        ("/usr/lib/python3.11/concurrent/futures/thread.py", 58, "run"),
        ("/usr/lib/python3.11/concurrent/futures/thread.py", 83, "_worker"),
        *THREAD_RUN,
    ]
    other = [*JOIN, ("/work/job/net.py", 5, "serve"), *THREAD_RUN]
    found = threadwaits.edges(_threads(dump(main, worker, other)))
    assert [(e.waiter, e.target, e.kind) for e in found] == [(0, 1, "pool"), (1, 0, "import"), (2, 0, "join")], found
    assert rule(explain_stacks(dump(main, worker, other))) == "thread deadlock"


def test_event_and_queue_waits_alone_are_no_deadlock() -> None:
    """A main thread polling with ``stop.wait(1)`` and a worker waiting for work on a queue: each
    waits on something only the other could set by elimination, but no import lock closes the
    cycle: not told as a deadlock."""
    main = [(THREADING, 331, "wait"), (THREADING, 629, "wait"), ("/work/job/train.py", 12, "<module>")]
    worker = [
        (THREADING, 327, "wait"),
        ("/usr/lib/python3.11/queue.py", 171, "get"),
        ("/work/job/train.py", 5, "work"),
        *THREAD_RUN,
    ]
    assert [e.kind for e in threadwaits.edges(_threads(dump(main, worker)))] == ["signal", "signal"]
    assert threadwaits.deadlock(_threads(dump(main, worker))) is None
    assert rule(explain_stacks(dump(main, worker))) != "thread deadlock"


def test_a_join_without_a_cycle_says_which_thread_and_where_it_is() -> None:
    """Not "Waiting for a lock … in _wait_for_tstate_lock": the thread it joins and where that is."""
    main = [*JOIN, ("/work/job/train.py", 9, "<module>")]
    worker = [("/usr/lib/python3.11/socket.py", 700, "recv_into"), ("/work/job/train.py", 4, "fetch"), *THREAD_RUN]
    found = explain_stacks(dump(main, worker))
    assert rule(found) == "thread locks", found.sentence
    assert found.sentence == (
        "The main thread waits at train.py:9 in <module> for thread fetch() to end (Thread.join); thread fetch() is "
        "at train.py:4 in fetch (in socket.py:700 in recv_into)."
    ), found.sentence
    assert found.advice == ""


def test_nested_imports_the_advice_names_the_top_level_that_waits() -> None:
    """train.py imports a, whose top level imports b, whose top level joins a thread that imports a:
    the lock waited for is a's, the work to move is b's join."""
    main = [
        *JOIN,
        ("/work/job/b.py", 5, "<module>"),
        *IMPORTING_MAIN[:-1],
        ("/work/job/a.py", 2, "<module>"),
        *IMPORTING_MAIN,
    ]
    waiter = [*IMPORT_WAIT, ("/work/job/worker.py", 2, "run_a"), *THREAD_RUN]
    threads = _threads(dump(main, waiter))
    found = threadwaits.deadlock(threads, lambda fr: "    import a\n" if fr.func == "run_a" else "")
    assert found is not None
    assert "the main thread, importing b, waits at b.py:5 in <module> for thread run_a() to end" in found.sentence
    assert "for the import of a, which the main thread is running" in found.sentence, found.sentence
    assert "move the work at b.py:5 (the top level of b, run by its import)" in found.advice, found.advice
    unnamed = threadwaits.deadlock(threads)
    assert unnamed is not None and "for a module's import, which the main thread is running" in unnamed.sentence
