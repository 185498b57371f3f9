"""Shared fixtures: ``journal`` writes journal records by hand; ``collector`` runs a real rotel."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from collector import Collector, rotel_agent_path
from lora_otel.journal.reader import Journal, read_journal, start_ticks_from_stat

# lora_otel's internal errors fail this suite's tests instead of being reported and swallowed
# (`lora_otel._boot.core.strict`); only here: a user's own pytest run must pass as without lora_otel.
# The traced subprocesses the tests start fail open as a user's do (`procs.clean_env` drops it).
os.environ["LORA_OTEL_STRICT_INTERNAL"] = "1"

# A suite started in the background by a shell without job control (`.ci/run &` in a script, nohup)
# runs with SIGINT ignored, and every process it starts inherits that: the tests' Ctrl-C (SIGINT to a
# job, to `lora-otel watch`) would then be ignored and the test wait for an exit that never comes
# (issue 23: the "flaky" test_ctrl_c_exits_quietly_with_130). The tests press Ctrl-C as a terminal
# does, so the suite takes the default back; an exec'd child then starts with SIGINT at its default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

NO_TORCH_ENV = "LORA_OTEL_TEST_NO_TORCH"
"""Set to ``1`` by the Python matrix of ``.ci/run`` for its venvs without torch (3.9, 3.12): there the
tests marked ``torch`` are skipped, saying why. Anywhere else a missing torch fails them, as before:
the main suite never skips for want of torch."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(NO_TORCH_ENV) != "1":
        return
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        raise pytest.UsageError("%s=1, but torch is installed in this Python: unset it" % NO_TORCH_ENV)
    skip = pytest.mark.skip(
        reason="torch is not installed in this Python (%s=1: the matrix's torch-free venv)" % NO_TORCH_ENV
    )
    for item in items:
        if item.get_closest_marker("torch") is not None:
            item.add_marker(skip)


T0 = 1_795_990_428_000_000_000
"""The default start of a hand-written journal, Unix ns (2026-11-29T22:13:48Z)."""
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT_PARENT = "b7ad6b7169203331"

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
"""Settings for the fuzz tests; they rewrite one file under ``tmp_path`` per example."""

_RECORD_KEYS = [
    "v",
    "k",
    "ts",
    "trace_id",
    "span_id",
    "parent_id",
    "name",
    "attrs",
    "status",
    "message",
    "steps",
    "last_step_ts",
    "metrics",
    "level",
    "msg",
    "code",
    "how",
    "pid",
    "start_ticks",
    "config",
    "sampled",
]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_plausible = st.sampled_from(
    [
        1,
        2,
        0,
        -1,
        None,
        {},
        T0,
        T0 + 10**9,
        2**63,
        "start",
        "end",
        "event",
        "attrs",
        "beat",
        "line",
        "exit",
        "process",
        "import x",
        "training",
        TRACE_ID,
        "0000000000000001",
        "0000000000000002",
        "ok",
        "error",
        {"import_threshold_ms": 5},
        {"import_threshold_ms": "x"},
        {"k": [1, "a"], "n": 2**70},
    ]
)
_valid_records = st.sampled_from(
    [
        {
            "v": 1,
            "k": "start",
            "ts": T0,
            "trace_id": TRACE_ID,
            "span_id": "0000000000000001",
            "parent_id": None,
            "name": "process",
            "pid": 1,
            "start_ticks": None,
            "config": {"import_threshold_ms": 5},
            "attrs": {},
        },
        {
            "v": 1,
            "k": "start",
            "ts": T0 + 1,
            "trace_id": TRACE_ID,
            "span_id": "0000000000000002",
            "parent_id": "0000000000000001",
            "name": "import x",
            "attrs": {"lora_otel.package.version": "1"},
        },
        {"v": 1, "k": "end", "ts": T0 + 2, "span_id": "0000000000000002", "status": "ok"},
        {"v": 1, "k": "event", "ts": T0 + 2, "span_id": "0000000000000001", "name": "mark", "attrs": {}},
        {"v": 1, "k": "attrs", "ts": T0 + 2, "span_id": "0000000000000001", "attrs": {"host.name": "h"}},
        {"v": 1, "k": "beat", "ts": T0 + 3, "steps": 1, "last_step_ts": T0},
        {"v": 1, "k": "line", "ts": T0 + 3, "level": "info", "msg": "hello"},
        {"v": 1, "k": "exit", "ts": T0 + 4, "code": 0, "how": "normal"},
    ]
)
_field = st.sampled_from(_RECORD_KEYS)
_records = st.tuples(_valid_records, st.dictionaries(_field, _plausible | _json_values, max_size=2)).map(
    lambda pair: {**pair[0], **pair[1]}
) | st.dictionaries(_field, _plausible | _json_values, max_size=10)
journal_lines = st.lists(_records, max_size=12).map(
    lambda records: "".join(json.dumps(record) + "\n" for record in records)
)
"""Journal text of random JSON objects made from the record vocabulary (for fuzz tests)."""


def own_start_ticks() -> int:
    """Field 22 of this test process's ``/proc/self/stat``."""
    with open("/proc/self/stat") as f:
        ticks = start_ticks_from_stat(f.read())
    assert ticks is not None
    return ticks


class JournalBuilder:
    """Writes journal records (docs/journal.md) to ``path``, one line each.

    Times are given as seconds after ``t0`` (Unix ns). Span ids are deterministic: 0000…0001,
    0000…0002, … ``start`` parents a span to the ``process`` span unless told otherwise.
    """

    def __init__(self, path: Path, t0: int = T0) -> None:
        self.path = path
        self.t0 = t0
        self.root_id: Optional[str] = None
        self._last_id = 0
        path.write_bytes(b"")

    def ns(self, t: float) -> int:
        return self.t0 + round(t * 1e9)

    def new_span_id(self) -> str:
        self._last_id += 1
        return f"{self._last_id:016x}"

    def raw(self, data: bytes) -> None:
        """Append bytes exactly as given (for corrupt and truncated lines)."""
        with open(self.path, "ab") as f:
            f.write(data)

    def record(self, kind: str, t: float, **fields: Any) -> dict[str, Any]:
        """Append one record ``{"v":1,"k":kind,"ts":…, **fields}``."""
        record = {"v": 1, "k": kind, "ts": self.ns(t), **fields}
        self.raw(json.dumps(record).encode() + b"\n")
        return record

    def process(
        self,
        t: float = 0.0,
        *,
        alive: bool = False,
        parent_id: Optional[str] = None,
        attrs: Optional[dict[str, Any]] = None,
        config: Optional[dict[str, Any]] = None,
        sampled: bool = True,
        trace_id: str = TRACE_ID,
    ) -> str:
        """The ``process`` start record. Its pid is this test process's; with ``alive=False`` its
        ``start_ticks`` do not match, so the process reads as gone (a re-used pid)."""
        ticks = own_start_ticks() + (0 if alive else 1)
        self.root_id = self.new_span_id()
        self.record(
            "start",
            t,
            trace_id=trace_id,
            span_id=self.root_id,
            parent_id=parent_id,
            name="process",
            pid=os.getpid(),
            ppid=os.getppid(),
            start_ticks=ticks,
            config=config if config is not None else {"import_threshold_ms": 5},
            sampled=sampled,
            attrs=attrs if attrs is not None else {"service.name": "train.py", "process.pid": os.getpid()},
        )
        return self.root_id

    def start(
        self,
        name: str,
        t: float,
        *,
        parent: Optional[str] = "root",
        attrs: Optional[dict[str, Any]] = None,
        trace_id: str = TRACE_ID,
    ) -> str:
        span_id = self.new_span_id()
        parent_id = self.root_id if parent == "root" else parent
        self.record("start", t, trace_id=trace_id, span_id=span_id, parent_id=parent_id, name=name, attrs=attrs or {})
        return span_id

    def end(
        self,
        span_id: str,
        t: float,
        status: str = "ok",
        message: Optional[str] = None,
        attrs: Optional[dict[str, Any]] = None,
    ) -> None:
        fields: dict[str, Any] = {"span_id": span_id, "status": status}
        if message is not None:
            fields["message"] = message
        if attrs:
            fields["attrs"] = attrs
        self.record("end", t, **fields)

    def span(self, name: str, t: float, duration: float, **kw: Any) -> str:
        """A span that starts at ``t`` and ends ``duration`` seconds later, status ok."""
        span_id = self.start(name, t, **kw)
        self.end(span_id, t + duration)
        return span_id

    def event(self, span_id: str, t: float, name: str, attrs: Optional[dict[str, Any]] = None) -> None:
        self.record("event", t, span_id=span_id, name=name, attrs=attrs or {})

    def beat(self, t: float, steps: int = 0, last_step_t: Optional[float] = None) -> None:
        self.record("beat", t, steps=steps, last_step_ts=None if last_step_t is None else self.ns(last_step_t))

    def line(self, t: float, msg: str, level: str = "info") -> None:
        self.record("line", t, level=level, msg=msg)

    def exit(self, t: float, code: Optional[int] = 0, how: str = "normal", message: Optional[str] = None) -> None:
        fields: dict[str, Any] = {"code": code, "how": how}
        if message is not None:
            fields["message"] = message
        self.record("exit", t, **fields)

    def read(self) -> Journal:
        return read_journal(self.path)


@pytest.fixture
def journal(tmp_path: Path) -> JournalBuilder:
    """An empty journal file ``run.otel.jsonl`` in ``tmp_path``, and the means to write to it."""
    return JournalBuilder(tmp_path / "run.otel.jsonl")


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    """A real rotel collector on free loopback ports, stopped after the test."""
    binary = rotel_agent_path()
    if binary is None:
        pytest.skip("the rotel collector is not installed (pip install rotel)")
    running = Collector(binary, tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session", autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``XDG_STATE_HOME`` points into a directory of this session, for the test process and every
    process it starts: no test writes to the real ``~/.local/state`` (where journals go by default)."""
    old = os.environ.get("XDG_STATE_HOME")
    state = tmp_path_factory.mktemp("state-home")
    os.environ["XDG_STATE_HOME"] = str(state)
    try:
        yield state
    finally:
        if old is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = old


@pytest.fixture(autouse=True)
def _forget_redacted_values() -> Iterator[None]:
    """Each test starts with no remembered secrets: `redact` scrubs every value it has redacted in
    this process (``redact.scrub``), which would otherwise carry over from one test to the next."""
    from lora_otel._boot import redact

    forget = getattr(redact, "forget", lambda: None)
    forget()
    yield
    forget()


# The fast tier (`pytest -m "not slow"`, CONTRIBUTING.md) starts no process: a test that does is
# marked slow. An audit hook notes every process start; a test without the mark fails on one.
_PROCESS_STARTS = ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec", "os.system", "pty.spawn")
_started: Optional[list[str]] = None


def _note_process_start(event: str, args: tuple[Any, ...]) -> None:
    if _started is not None and event in _PROCESS_STARTS:
        _started.append("%s %s" % (event, str(args[0] if args else "")[:80]))


sys.addaudithook(_note_process_start)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test not marked ``slow`` that starts a process fails, naming the start: mark it slow."""
    global _started
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    _started = seen = []
    try:
        yield
    finally:
        _started = None
    assert not seen, "a test not marked slow started a process (%s): mark it @pytest.mark.slow" % seen[0]
