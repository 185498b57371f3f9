"""Does every view name the place and the cause of a real hang? (issue 21's figures)

    python bench/real_causes.py [--set real|trackers] [--case NAME] [--json FILE] [--list]

Each case is a real small program started as a launcher starts a job: ``LORA_OTEL=1``, in its own
session, stdout and stderr appended to ``log.txt``, given ``--log run.log``, journals in the case's
own directory, short stall limits (``LORA_OTEL_STALL_AFTER``, 3 s). The process that hangs writes
the time just before it hangs into ``hung.at`` (and the pids a right diagnosis must name into
``ctx_<name>`` files). Once the first ``STALLED`` line is in ``log.txt`` (or the case's own end),
the bench reads every view a user has (``--wait`` S: how long past the limit to wait for that line):

- ``stderr``: the job's own lines in ``log.txt``, from the first ``STALLED``/death line on;
- ``--log``: the same in ``run.log``, the job's ``--log`` file;
- ``inspect``: ``python -m lora_otel inspect DIR``, its summary (the span trees and stacks left out);
- ``watch``: ``python -m lora_otel watch DIR --once --no-color``, the same;
- ``report``: ``python -m lora_otel report DIR -o -``, the page's text down to its timeline.

A view *names the place* when the case's place regex (``job.py:12``, ``pool.py``, a stage) is
in that text, and *names the cause* when the case's cause regex (the sentence the right diagnosis
must have) is. ``@tag`` in a regex is the number of the source line marked ``# @tag``; ``<<name>>``
is the value the job wrote to ``ctx_<name>``. A case may also give an *advice* regex (what a right
next step says): a view *gives the advice* when that regex is in its ``what to do:`` text (the rest
of each line that has ``what to do:``; the report's inline tags are joined first); a case with no
advice regex gets ``—`` there. Seconds: from ``hung.at`` to the first ``STALLED``
line's own timestamp, against the limit + 2 s. Cases run one after the other; the torch ones are
skipped when torch is missing, the filelock one when filelock is.

``--set trackers`` runs the cases of ``bench/tracker_causes.py`` instead: hangs drawn from real
issue trackers (each case's ``source``), none of them one of the cases here.
"""

from __future__ import annotations

import argparse
import calendar
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent
VIEWS = ("stderr", "--log", "inspect", "watch", "report")
SLACK_S = 2.0  # the goal: the STALLED line within the limit + 2 s
LINE = re.compile(r"^\[lora-otel\]\[(\d+)\]\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)Z\] (.*)$")
PREAMBLE = re.compile(r"^(started pid|argv:|cwd:|environment:|env:|CUDA:)")

# What every job starts with: its arguments parsed (a real trainer's first act) and a way to say
# when it hangs.
HEAD = """\
import argparse, os, sys, time
argparse.ArgumentParser().parse_known_args()


def mark(**ctx):
    for k, v in ctx.items():
        open("ctx_" + k, "w").write(str(v))
    open("hung.at", "w").write(repr(time.time()))
"""
# A trainer imports torch: only such a process is called stalled for quiet time with no stage open
# (`lora_otel.analysis.stall.idle_may_be_stuck`).
TRAINER = HEAD + "import torch\n"


@dataclass
class Case:
    """One real cause of a hang: the programs, what a right diagnosis names, and the limits."""

    name: str
    files: dict
    place: str
    cause: str
    limit_s: float = 3.0
    env: dict = field(default_factory=dict)
    line: Optional[str] = "STALLED:"  # the job's line whose time is measured; None: the case just ends
    needs: tuple = ()  # modules the case needs (skipped without them)
    setup: Optional[Callable] = None  # (case dir) -> (ctx values, cleanup)
    about: str = ""
    advice: Optional[str] = None  # what a right next step says (in a view's `what to do:` text)
    source: str = ""  # the issue or pull request that reports this cause


# --- the programs -----------------------------------------------------------------------------------

IMPORT_HANG = Case(
    "import hang",
    {
        "job.py": HEAD + "mark()\nimport slowmod  # @import\n",
        "slowmod.py": "import time\ntime.sleep(600)  # @sleep\n",
    },
    place=r"slowmod\.py:@sleep",
    cause=r"(?i)\b(sleeping|sleeps|asleep)\b",
    env={"LORA_OTEL_STALL_AFTER": "import=3"},
    about="an import whose body sleeps",
)


def _silent_server(case_dir: Path) -> tuple:
    """A TCP server that accepts and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()

    def close() -> None:
        for c in held:
            c.close()
        srv.close()

    return {"port": srv.getsockname()[1]}, close


HUB = Case(
    "hub download",
    {
        "job.py": TRAINER
        + "from huggingface_hub import hf_hub_download\nmark()\n"
        + "hf_hub_download('org/model', 'model.safetensors')  # @call\n",
        "huggingface_hub/__init__.py": textwrap.dedent("""\
            import socket
            PORT = int(open("ctx_port").read())

            def hf_hub_download(repo_id, filename):
                s = socket.create_connection(("127.0.0.1", PORT))
                s.sendall(b"GET /%s/resolve/main/%s HTTP/1.1\\r\\n\\r\\n" % (repo_id.encode(), filename.encode()))
                return s.recv(1)  # @recv
            """),
    },
    place=r"job\.py:@call|huggingface_hub/__init__\.py:@recv|inside huggingface_hub",
    cause=r"Waiting on the network inside huggingface_hub.*127\.0\.0\.1:<<port>>",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    setup=_silent_server,
    about="a local package named huggingface_hub reading from a server that never answers",
)

DEADLOCK = Case(
    "thread deadlock",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import threading
            lock_a, lock_b = threading.Lock(), threading.Lock()

            def worker():
                with lock_b:
                    time.sleep(0.5)
                    with lock_a:  # @worker
                        pass

            with lock_a:
                threading.Thread(target=worker, daemon=True).start()
                time.sleep(0.5)
                mark()
                with lock_b:  # @main
                    pass
            """),
    },
    place=r"job\.py:@main",
    cause=r"Deadlock: the main thread waits in lock_b\.acquire.*holding lock_a.*thread worker\(\) waits in lock_a",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="two threads, each holding the lock the other waits for",
)

DATALOADER = Case(
    "DataLoader worker",
    {
        "job.py": HEAD
        + textwrap.dedent("""\
            import torch
            from torch.utils.data import DataLoader, Dataset
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)

            class Samples(Dataset):
                def __len__(self):
                    return 400

                def __getitem__(self, i):
                    if i == 40:
                        mark(hung_pid=os.getpid())
                        time.sleep(600)  # @sleep
                    return torch.ones(4)

            for batch in DataLoader(Samples(), batch_size=4, num_workers=2):  # @loop
                model(batch).sum().backward()
                opt.step()
                opt.zero_grad()
            """),
    },
    place=r"job\.py:@loop",
    cause=r"DataLoader.*worker pid <<hung_pid>>",
    env={"LORA_OTEL_STALL_AFTER": "training=3", "OMP_NUM_THREADS": "1"},
    needs=("torch",),
    about="a DataLoader worker sleeps on one sample after training started",
)

FROZEN = Case(
    "frozen native call",
    {
        "job.py": HEAD + "mark()\nimport frozenmod\n",
        "frozenmod.py": textwrap.dedent("""\
            import ctypes

            def hold():
                while True:
                    ctypes.PyDLL(None).pause()  # @pause

            hold()
            """),
    },
    place=r"frozenmod\.py:@pause",
    cause=r"Holding the GIL in native code",
    env={"LORA_OTEL_FROZEN_AFTER": "3"},
    about="pause() called holding the GIL (the beat stops)",
)

GLOO = Case(
    "gloo collective",
    {
        "job.py": HEAD
        + textwrap.dedent("""\
            import subprocess
            ranks = [
                subprocess.Popen(
                    [sys.executable, "train.py"],
                    env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r)),
                )
                for r in range(2)
            ]
            for p in ranks:
                p.wait()
            """),
        "train.py": HEAD
        + textwrap.dedent("""\
            import datetime
            import torch
            import torch.distributed as dist

            rank = int(os.environ["RANK"])
            dist.init_process_group(
                "gloo", init_method="file://" + os.path.abspath("rendezvous"), rank=rank, world_size=2,
                timeout=datetime.timedelta(seconds=600),
            )
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(1, 31):
                model(torch.ones(1, 4)).sum().backward()
                if rank == 1 and step == 20:
                    opt.step()  # without the all_reduce: rank 0 waits in it for ever
                    mark(missing_pid=os.getpid())
                    time.sleep(600)  # @skip
                for p in model.parameters():
                    dist.all_reduce(p.grad)  # @allreduce
                opt.step()
                opt.zero_grad()
                time.sleep(0.05)
            """),
    },
    place=r"train\.py:@allreduce|train\.py:@skip",  # rank 0 waiting, or rank 1 where it is
    # rank 0's own why line, or the job view's callout naming rank 1 the stuck one and rank 0 waiting for it
    cause=r"rank 1 never arrived|rank 1 \(pid \d+\) is the one stuck.*rank 0 \(pid \d+\) waits for it in a collective",
    env={"LORA_OTEL_STALL_AFTER": "training=3", "OMP_NUM_THREADS": "1"},
    needs=("torch",),
    about="two gloo ranks on CPU (init_method file://); rank 1 never reaches the all_reduce",
)

POOL_TASK = Case(
    "Pool task never returns",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import multiprocessing

            def work(i):
                if i == 2:
                    mark(hung_pid=os.getpid())
                    time.sleep(600)  # @sleep
                return i

            if __name__ == "__main__":
                with multiprocessing.Pool(2) as pool:
                    print(pool.map(work, range(8)))  # @map
            """),
    },
    place=r"job\.py:@map|pool\.py",
    cause=r"(\b<<hung_pid>>\b.*job\.py:@sleep|job\.py:@sleep.*\b<<hung_pid>>\b)",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="multiprocessing.Pool.map; one task sleeps for ever in its worker",
)

POOL_KILLED = Case(
    "Pool worker SIGKILLed",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import multiprocessing, signal

            def work(i):
                if i == 2:
                    mark(killed_pid=os.getpid())
                    os.kill(os.getpid(), signal.SIGKILL)  # @kill
                time.sleep(0.1)
                return i

            if __name__ == "__main__":
                with multiprocessing.Pool(2) as pool:
                    print(pool.map(work, range(8)))  # @map
            """),
    },
    place=r"job\.py:@map|pool\.py",
    cause=r"(\b<<killed_pid>>\b.*killed by SIGKILL|killed by SIGKILL.*\b<<killed_pid>>\b)",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="a Pool worker is SIGKILLed mid-task (the OOM killer's way); the parent waits for ever",
)

PIPE = Case(
    "full stdout pipe",
    {
        "job.py": HEAD
        + textwrap.dedent("""\
            import subprocess
            child = subprocess.Popen([sys.executable, "child.py"], stdout=subprocess.PIPE)
            child.wait()  # @wait  (never reads the pipe)
            """),
        "child.py": TRAINER
        + textwrap.dedent("""\
            mark(reader_pid=os.getppid(), writer_pid=os.getpid())
            for i in range(10**6):
                print("step %d loss 0.123456789 " % i + "x" * 100)  # @print
            """),
    },
    place=r"child\.py:@print",
    cause=r"(?i)pipe.*\b<<reader_pid>>\b",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="a launcher reads its child's stdout pipe never; the child blocks writing to it",
)


def _lock_holder(case_dir: Path) -> tuple:
    """Another process (not traced) holding ``model.lock`` with filelock."""
    holder = subprocess.Popen(
        [
            PY,
            "-c",
            "import filelock, os, time\nlock = filelock.FileLock('model.lock')\nlock.acquire()\n"
            "open('holder.ready', 'w').write(str(os.getpid()))\ntime.sleep(600)\n",
        ],
        cwd=case_dir,
        env=_env({}, traced=False),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait(lambda: (case_dir / "holder.ready").exists(), 30, "the lock holder")

    def close() -> None:
        holder.kill()
        holder.wait()

    return {"holder_pid": holder.pid}, close


FILELOCK = Case(
    "held filelock",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            from filelock import FileLock
            mark()
            with FileLock("model.lock"):  # @lock
                pass
            """),
    },
    place=r"job\.py:@lock|filelock/\S+\.py:\d+|FileLock",  # not "since import filelock ended"
    cause=r"(model\.lock.*\b<<holder_pid>>\b|\b<<holder_pid>>\b.*model\.lock)",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    needs=("filelock",),
    setup=_lock_holder,
    about="filelock.FileLock('model.lock') held by another process",
)

FIRST_FAILURE = Case(
    "child killed before a sibling errors",
    {
        "job.py": HEAD
        + textwrap.dedent("""\
            import subprocess
            a = subprocess.Popen([sys.executable, "worker.py", "killed"])
            b = subprocess.Popen([sys.executable, "worker.py", "errors"])
            codes = [b.wait(), a.wait()]
            open("launcher.done", "w").write(repr(codes))
            sys.exit(1)
            """),
        "worker.py": HEAD
        + textwrap.dedent("""\
            import signal
            what = sys.argv[1]
            time.sleep(1.5)  # a job by now (its first beat)
            if what == "killed":
                mark(killed_pid=os.getpid())
                os.kill(os.getpid(), signal.SIGKILL)  # @kill
            time.sleep(1.5)
            raise RuntimeError("the sibling failed after the other was killed")  # @raise
            """),
    },
    place=r"(\(pid <<killed_pid>>\)|process <<killed_pid>>)[^\n]*(first|killed)",
    cause=r"killed by SIGKILL",
    line=None,
    about="a launcher's child is SIGKILLed; 1.5 s later its sibling raises; the launcher exits 1",
)


def _black_hole(case_dir: Path) -> tuple:
    """A listening socket whose accept queue is full and never accepted: a connect's SYN is dropped
    (as a firewall that drops, or a host that is gone, does)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(s)

    def close() -> None:
        for s in fillers:
            s.close()
        srv.close()

    return {"port": port}, close


CONNECT = Case(
    "connect to a black hole",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import socket
            port = int(open("ctx_port").read())
            mark()
            conn = socket.create_connection(("127.0.0.1", port))  # @connect
            """),
    },
    place=r"job\.py:@connect",
    cause=r"(?i)(connect\w*.*127\.0\.0\.1:<<port>>|127\.0\.0\.1:<<port>>.*(SYN|connect))",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    setup=_black_hole,
    about="socket.create_connection to an address whose SYNs are dropped",
)

QUEUE_WORKER = Case(
    "map worker waits on a queue",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import multiprocessing

            def worker(tasks, results):
                mark(hung_pid=os.getpid())
                item = tasks.get()  # @get  (nobody ever puts a task)
                results.put(item)

            if __name__ == "__main__":
                tasks, results = multiprocessing.Queue(), multiprocessing.Queue()
                p = multiprocessing.Process(target=worker, args=(tasks, results))
                p.start()
                print(results.get())  # @wait
            """),
    },
    place=r"job\.py:@wait",
    cause=r"(\b<<hung_pid>>\b.*job\.py:@get|job\.py:@get.*\b<<hung_pid>>\b)",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="a dataset .map(num_proc=…)-style worker waits on a task queue nobody fills",
)

ALREADY_DEAD = Case(
    "process already dead",
    {
        "job.py": HEAD
        + textwrap.dedent("""\
            import subprocess
            trainer = subprocess.Popen([sys.executable, "train.py"])
            trainer.wait()
            while True:  # a UI that shows "running" for ever
                time.sleep(0.5)  # @idle
            """),
        "train.py": TRAINER
        + textwrap.dedent("""\
            import signal
            time.sleep(1.5)  # a job by now (its first beat)
            mark(killed_pid=os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)  # @kill  (the OOM killer's signal)
            """),
    },
    place=r"train\.py|pid <<killed_pid>>|process <<killed_pid>>",
    cause=r"killed by SIGKILL|killed by the OOM killer",
    line=r"STALLED:|died|was killed",
    limit_s=0.0,  # a death is said at once: the goal is the 2 s slack
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="the trainer is SIGKILLed; the launcher that started it idles on",
)

CASES = [
    IMPORT_HANG,
    HUB,
    DEADLOCK,
    DATALOADER,
    FROZEN,
    GLOO,
    POOL_TASK,
    POOL_KILLED,
    PIPE,
    FILELOCK,
    FIRST_FAILURE,
    CONNECT,
    QUEUE_WORKER,
    ALREADY_DEAD,
]


# --- running one case ---------------------------------------------------------------------------


def _env(extra: dict, traced: bool = True) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LORA_OTEL", "OTEL_", "PYTEST_")) and k not in ("TRACEPARENT", "PYTHONPATH")
    }
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=".", PYTHONPATH=str(REPO))
    env.update(extra)
    return env


def _wait(predicate: Callable, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _stamp(line: str) -> Optional[float]:
    m = LINE.match(line)
    if m is None:
        return None
    return calendar.timegm(time.strptime(m.group(2), "%Y-%m-%dT%H:%M:%S")) + float(m.group(3))


def _first_line(text: str, pattern: str) -> Optional[str]:
    for line in text.splitlines():
        m = LINE.match(line)
        if m and re.search(pattern, m.group(4)):
            return line
    return None


def _own_lines(text: str, case: Case, hung_at: Optional[float]) -> str:
    """The job's lines a user reads about the hang: from its first STALLED (or death) line on;
    for a case with no such line, every line after the hang began but the start-up ones."""
    out, on = [], False
    for line in text.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        body = m.group(4)
        if case.line is not None:
            on = on or re.search(case.line, body) is not None
        else:
            stamp = _stamp(line)
            on = hung_at is not None and stamp is not None and stamp >= hung_at - 0.5
        if on and not PREAMBLE.match(body):
            out.append(body)
    return "\n".join(out)


def _summary(text: str) -> str:
    """A view's summary: its output without the span trees and the stacks (from a ``journal:``
    line, everything indented at least as deep), nor the ``report:`` hint."""
    out: list = []
    skip_from: Optional[int] = None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if skip_from is not None:
            if stripped and indent >= skip_from and not _is_header(stripped):
                continue
            skip_from = None
        if stripped.startswith("journal: "):
            skip_from = indent
            continue
        if stripped.startswith("report: lora-otel report"):
            continue
        out.append(line)
    return "\n".join(out)


def _is_header(line: str) -> bool:
    """A line that starts another process or job in inspect's and watch's output."""
    return re.match(r"(job [0-9a-f]{32}\b|([\w ]+, )?pid \d+: |\(the other )", line) is not None


def _report_text(page: str) -> str:
    """The report page's words, down to its timeline (its heading, verdict and lanes)."""
    page = re.sub(r"(?is)<(script|style)\b.*?</\1>", "", page)
    words = html.unescape(re.sub(r"<[^>]+>", "\n", page))
    words = words.split("\nTimeline\n", 1)[0]
    return "\n".join(w.strip() for w in words.splitlines() if w.strip())


INLINE = re.compile(r"(?i)</?(code|b|i|em|strong|span|a|kbd|tt|samp|small|abbr)\b[^>]*>")
ADVICE = re.compile(r"(?i)what to do:")


def _report_inline(page: str) -> str:
    """The report's words as ``_report_text`` has them, but with inline tags (``<code>`` …) joined
    into their line, so that a ``what to do:`` sentence stays one line."""
    return _report_text(INLINE.sub("", page))


def _advice_text(text: str) -> str:
    """What a view says to do: the rest of every line that has ``what to do:`` (the next line
    when that rest is empty, as where a page puts the label and the sentence apart)."""
    out: list = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = ADVICE.search(line)
        if m is None:
            continue
        rest = line[m.end() :].strip()
        if not rest and i + 1 < len(lines):
            rest = lines[i + 1].strip()
        if rest:
            out.append(rest)
    return "\n".join(out)


def _cli(case_dir: Path, *args: str) -> str:
    r = subprocess.run(
        [PY, "-m", "lora_otel", *args],
        cwd=case_dir,
        env=_env({}, traced=False) | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.stdout + r.stderr


def _resolve(pattern: str, case: Case, ctx: dict) -> str:
    """``@tag`` → the number of the line marked ``# @tag``; ``<<name>>`` → the job's value."""

    def line_of(m: re.Match) -> str:
        for source in case.files.values():
            for n, line in enumerate(source.splitlines(), 1):
                if re.search(r"# @%s\b" % m.group(1), line):
                    return str(n)
        raise KeyError("no line marked # @%s in case %r" % (m.group(1), case.name))

    pattern = re.sub(r"@(\w+)", line_of, pattern)
    return re.sub(r"<<(\w+)>>", lambda m: re.escape(str(ctx.get(m.group(1), "<no %s>" % m.group(1)))), pattern)


def _processes_in(directory: Path) -> list:
    """Live processes whose working directory is ``directory`` (what the case started)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink("/proc/%s/cwd" % pid) == str(directory):
                found.append(int(pid))
        except OSError:
            pass
    return found


def _end(proc: subprocess.Popen, case_dir: Path) -> None:
    """SIGKILL the job's session, then whatever else still runs in the case's directory."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for pid in _processes_in(case_dir):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _wait(lambda: not _processes_in(case_dir), 10, "the case's processes to go")


def _has_stall_record(case_dir: Path) -> bool:
    """Whether a journal in ``case_dir`` has a ``stall`` record (the watchdog writes it, with the
    stacks it asked for, around the line)."""
    for path in case_dir.glob("*.otel.jsonl"):
        try:
            if b'"k":"stall"' in path.read_bytes():
                return True
        except OSError:
            pass
    return False


def run_case(case: Case, keep: bool = False, wait_s: float = 8.0) -> dict:
    """Run ``case``; its rows (one per view) and its timing. ``wait_s``: how long past the limit
    to wait for the job's line before reading the views without it."""
    case_dir = Path(tempfile.mkdtemp(prefix="lora-otel-cause-")).resolve()
    for name, source in case.files.items():
        path = case_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    ctx: dict = {}
    cleanup: Callable = lambda: None  # noqa: E731 - the default: nothing to close
    started = time.monotonic()
    if case.setup is not None:
        ctx, cleanup = case.setup(case_dir)
        for k, v in ctx.items():
            (case_dir / ("ctx_" + k)).write_text(str(v))
    out = open(case_dir / "log.txt", "ab")  # noqa: SIM115 - the job's stdout and stderr, closed below
    proc = subprocess.Popen(
        [PY, "job.py", "--log", "run.log"],
        cwd=case_dir,
        env=_env(case.env),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )
    out.close()
    views: dict = {}
    todo: dict = {}  # each view's `what to do:` text
    first: dict = {}
    hung_at: Optional[float] = None
    try:
        hung = _wait(lambda: (case_dir / "hung.at").exists() and _text(case_dir / "hung.at"), 90, "the hang")
        hung_at = float(hung) if hung else None
        if case.line is not None:
            said = _wait(
                lambda: _first_line(_text(case_dir / "log.txt"), case.line), case.limit_s + wait_s, "the STALLED line"
            )
            if said:
                _wait(lambda: _has_stall_record(case_dir), wait_s, "the stall record beside the line")
                # the watchdog's why line follows the job's own STALLED line, after the record
                _wait(lambda: "is stalled: " in _text(case_dir / "log.txt"), max(wait_s, 30.0), "the why line")
            for view, name in (("stderr", "log.txt"), ("--log", "run.log")):
                first[view] = _first_line(_text(case_dir / name), case.line)
        else:
            _wait(lambda: proc.poll() is not None, 60, "the launcher to end")
            time.sleep(2.0)  # the watchdogs' last records
        for f in case_dir.glob("ctx_*"):
            ctx[f.name[4:]] = _text(f).strip()
        views["stderr"] = _own_lines(_text(case_dir / "log.txt"), case, hung_at)
        views["--log"] = _own_lines(_text(case_dir / "run.log"), case, hung_at)
        views["inspect"] = _summary(_cli(case_dir, "inspect", str(case_dir)))
        views["watch"] = _summary(_cli(case_dir, "watch", str(case_dir), "--once", "--no-color"))
        page = _cli(case_dir, "report", str(case_dir), "-o", "-")
        views["report"] = _report_text(page)
        for view in VIEWS:
            todo[view] = _advice_text(_report_inline(page) if view == "report" else views[view])
    finally:
        _end(proc, case_dir)
        cleanup()
    place, cause = _resolve(case.place, case, ctx), _resolve(case.cause, case, ctx)
    advice = None if case.advice is None else _resolve(case.advice, case, ctx)
    seconds = {view: _seconds(first.get(view), hung_at) for view in ("stderr", "--log")}
    rows = []
    for view in VIEWS:
        text = views.get(view, "")
        rows.append(
            {
                "case": case.name,
                "view": view,
                "place": re.search(place, text, re.S) is not None,
                "cause": re.search(cause, text, re.S) is not None,
                "advice": None if advice is None else re.search(advice, todo.get(view, ""), re.S) is not None,
                "seconds": seconds.get(view),
                "text": text,
                "what_to_do": todo.get(view, ""),
            }
        )
    if keep:
        print("kept %s" % case_dir, file=sys.stderr)
    else:
        shutil.rmtree(case_dir, ignore_errors=True)
    return {
        "case": case.name,
        "about": case.about,
        "place_re": place,
        "cause_re": cause,
        "advice_re": advice,
        "source": case.source,
        "limit_s": case.limit_s if case.line is not None else None,
        "seconds": seconds["stderr"],
        "hung": hung_at is not None,
        "wall_s": round(time.monotonic() - started, 1),
        "rows": rows,
    }


def _seconds(line: Optional[str], hung_at: Optional[float]) -> Optional[float]:
    """From the hang's start to ``line``'s own timestamp."""
    stamp = None if line is None else _stamp(line)
    return None if stamp is None or hung_at is None else stamp - hung_at


def _missing(case: Case) -> Optional[str]:
    import importlib.util

    needs = case.needs + (("torch",) if any("import torch" in src for src in case.files.values()) else ())
    for name in needs:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def _yes(flag: Optional[bool]) -> str:
    return "—" if flag is None else ("yes" if flag else "no")


def _count(rows: list, key: str) -> str:
    """``n/m`` over the rows that have a verdict for ``key`` (advice: the cases with a regex)."""
    judged = [r for r in rows if r.get(key) is not None]
    return "%d/%d" % (sum(bool(r[key]) for r in judged), len(judged))


def table(results: list) -> str:
    lines = [
        "| case | view | place | cause | advice | STALLED after (s) | goal: limit + %g s |" % SLACK_S,
        "|---|---|---|---|---|---:|---|",
    ]
    for res in results:
        for row in res["rows"]:
            if row["seconds"] is not None:
                secs = "%.1f" % row["seconds"]
                within = (
                    "yes (≤ %g)" % (res["limit_s"] + SLACK_S)
                    if row["seconds"] <= res["limit_s"] + SLACK_S
                    else ("no (> %g)" % (res["limit_s"] + SLACK_S))
                )
            elif row["view"] in ("stderr", "--log") and res["limit_s"] is not None:
                secs, within = "none", "no"
            else:
                secs, within = "—", ""
            lines.append(
                "| %s | %s | %s | %s | %s | %s | %s |"
                % (
                    res["case"],
                    row["view"],
                    _yes(row["place"]),
                    _yes(row["cause"]),
                    _yes(row.get("advice")),
                    secs,
                    within,
                )
            )
    rows = [row for res in results for row in res["rows"]]
    if rows:
        advised = [r for r in rows if r.get("advice") is not None]
        lines.append("")
        lines.append(
            "totals: %d rows; place named in %d (%.0f %%), cause named in %d (%.0f %%)"
            % (
                len(rows),
                sum(r["place"] for r in rows),
                100.0 * sum(r["place"] for r in rows) / len(rows),
                sum(r["cause"] for r in rows),
                100.0 * sum(r["cause"] for r in rows) / len(rows),
            )
            + (
                "; a right next step in %d of %d (%.0f %%)"
                % (
                    sum(r["advice"] for r in advised),
                    len(advised),
                    100.0 * sum(r["advice"] for r in advised) / len(advised),
                )
                if advised
                else ""
            )
        )
        for view in VIEWS:
            sub = [r for r in rows if r["view"] == view]
            lines.append(
                "  %-8s place %s, cause %s, advice %s"
                % (view, _count(sub, "place"), _count(sub, "cause"), _count(sub, "advice"))
            )
        timed = [res for res in results if res["limit_s"] is not None]
        lines.append(
            "  STALLED line within the limit + %g s: %d/%d cases"
            % (
                SLACK_S,
                sum(res["seconds"] is not None and res["seconds"] <= res["limit_s"] + SLACK_S for res in timed),
                len(timed),
            )
        )
    return "\n".join(lines)


def _cases(name: str) -> list:
    """The cases of a set: ``real`` (this module's) or ``trackers`` (bench/tracker_causes.py)."""
    if name == "real":
        return CASES
    # tracker_causes imports this module by its name: make it this very module when run as a script
    sys.modules.setdefault("real_causes", sys.modules[__name__])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tracker_causes

    return tracker_causes.CASES


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", metavar="NAME", help="run only this case (repeatable; a prefix will do)")
    ap.add_argument("--json", metavar="FILE", help="also write the results, with each view's text, as JSON")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument(
        "--set",
        choices=("real", "trackers"),
        default="real",
        help="which cases: this module's (real, the default) or bench/tracker_causes.py's (trackers)",
    )
    ap.add_argument(
        "--wait",
        type=float,
        default=8.0,
        metavar="S",
        help="seconds past a case's limit to wait for its STALLED line (default 8; longer on a loaded machine)",
    )
    ap.add_argument("--keep", action="store_true", help="keep each case's directory (printed on stderr)")
    ap.add_argument("--verbose", action="store_true", help="print each view's text under the table")
    args = ap.parse_args(argv)
    cases = _cases(args.set)
    if args.list:
        for case in cases:
            print("%-38s %s%s" % (case.name, case.about, ("  (%s)" % case.source) if case.source else ""))
        return 0
    chosen = cases
    if args.case:
        chosen = [c for c in cases if any(c.name.lower().startswith(n.lower()) for n in args.case)]
        if not chosen:
            print("no case named %s (--list shows them)" % ", ".join(args.case), file=sys.stderr)
            return 2
    print(
        "lora_otel: real causes of hangs (set %s), every view — %s, Python %s, %d CPUs, %s\n"
        % (args.set, os.uname().machine, sys.version.split()[0], os.cpu_count() or 0, time.strftime("%Y-%m-%d"))
    )
    results = []
    started = time.monotonic()
    for case in chosen:
        missing = _missing(case)
        if missing is not None:
            print("skipped %s: no module %s" % (case.name, missing), file=sys.stderr)
            continue
        res = run_case(case, keep=args.keep, wait_s=args.wait)
        print(
            "%s: %s s%s" % (case.name, res["wall_s"], "" if res["hung"] else " (it never reached its hang)"),
            file=sys.stderr,
        )
        results.append(res)
    print(table(results))
    print("\n(%.0f s in all)" % (time.monotonic() - started))
    if args.verbose:
        for res in results:
            print(
                "\n## %s\nplace: %s\ncause: %s\nadvice: %s"
                % (res["case"], res["place_re"], res["cause_re"], res["advice_re"])
            )
            for row in res["rows"]:
                print("--- %s\n%s" % (row["view"], row["text"]))
                if row["what_to_do"]:
                    print("(what to do: %s)" % row["what_to_do"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
