"""One sentence of diagnosis for a stall, drawn only from the evidence — or an honest "cannot tell".

The rules look at the Python stacks (faulthandler or py-spy), the process state and wait channel,
and the stall's kind, most specific first. Each rule names what it saw, so the sentence can be
checked against the evidence attached beside it.

A process waiting inside a torch.distributed collective (`collective_in` its stacks) is waiting
for the ranks that never arrived. With the journals of the other ranks of its world (the peers,
as one sidecar follows every process of a job), `explain` names them and says why, from what
those journals and the peers' own stacks show: the rank exited or vanished, is frozen, has made a
different number of optimizer steps, is in another stage, or its stack is not in that collective.
When nothing of that tells, it says it cannot tell which rank.

The causes are one ordered list, `RULES`: each a `Rule` naming the evidence it needs and an example
of its sentence, checked most specific first on one reading of the evidence (`Facts`). Every view
(the watchdog, the sidecar's live export, inspect, watch, the report, doctor) diagnoses through
`explain`, so a new cause is added in one place.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from lora_otel.analysis import ages, filelocks, hubcache, mplocks, native, pipes, polling, threadends, threadwaits
from lora_otel.analysis.evidence import FROM_OUTSIDE, PREFIX
from lora_otel.analysis.gil import gil_held, has_native_stacks
from lora_otel.analysis.pipes import full_pipe
from lora_otel.analysis.pools import ADVICE as POOL_ADVICE
from lora_otel.analysis.pools import pool_wait
from lora_otel.analysis.stall import FROZEN_AFTER_S, Stall
from lora_otel.analysis.waits import background_read, descriptor_wait, main_wait, network_mount
from lora_otel.journal.reader import Journal, exec_phrase, format_duration, process_state
from lora_otel.journal.tree import deepest_open_span, iso_time

_NET_MARKERS = ("socket.py", "ssl.py", "http/client.py", "urllib3/", "requests/", "httpx/", "selectors.py")
# Kernel wait channels of a task blocked on a socket.
_NET_WCHAN = ("sk_wait", "tcp_", "inet_", "sock_", "unix_stream", "udp_")
# Wait channels of a task polling descriptors: on the network when it holds a quiet connection.
_POLL_WCHAN = (
    "poll_schedule_timeout",
    "wait_woken",
    "sk_wait_data",
    "do_poll",
    "do_select",
    "do_sys_poll",
    "ep_poll",
    "__skb_wait_for_more_packets",
)

# A Python function of torch.distributed that performs or waits for a collective (with its
# variants: all_gather_object, reduce_scatter_tensor, _reduce_scatter_base, broadcast_object_list...).
_OP = re.compile(
    r"^_?(?:all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|barrier|monitored_barrier|"
    r"store_based_barrier|reduce|gather|scatter|send|recv|isend|irecv|batch_isend_irecv|"
    r"wait|wait_tensor|allreduce|allgather|alltoall)(?:_[a-z]+)*$"
)
# DistributedDataParallel's own collectives (buffer broadcasts, the unused-parameter all_reduce).
_DDP_OP = re.compile(r"broadcast|all_?reduce|all_?gather|sync_buffers|sync_params")
# torch.distributed modules that are not collectives: torchrun's agent, the launcher.
_NOT_COLLECTIVE = ("torch/distributed/elastic/", "torch/distributed/launcher/", "torch/distributed/run.py")
# Native frames (py-spy --native) of a process group or its backends, and the op they name.
_NATIVE = re.compile(r"ProcessGroup(?:Gloo|NCCL|MPI|UCC)|gloo::|nccl|c10d::", re.IGNORECASE)
_NATIVE_OPS = (
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("reduce_scatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("send", "send"),
    ("recv", "recv"),
)
MAX_NAMED = 4
"""Ranks described one by one in a sentence; beyond that they are counted."""


class Frame(NamedTuple):
    file: str
    line: str
    func: str
    python: bool  # a Python frame (a native one comes from py-spy --native)


@dataclass(frozen=True)
class Collective:
    """A thread waiting in a collective: ``op`` (``all_reduce``), and where the program called it."""

    op: str
    called_at: str = ""  # ``train.py:21 in <module>``: the first frame outside torch


@dataclass
class Diagnosis:
    sentence: str
    attrs: dict[str, Any] = field(default_factory=dict)
    """Extra attributes for the stall's event and log record (``lora_otel.collective.*``)."""
    ages: list[list[int]] = field(default_factory=list)
    """Where the sentence's growing durations are: ``[offset, length, ns]`` (`lora_otel.analysis.ages`)."""
    advice: str = ""
    """What to do, one sentence the user can act on, drawn from the same evidence as ``sentence``
    (the file to remove and why it is safe, the setting that stops a prompt ...); "" when the
    evidence supports no step: never a guess. Shown as its own ``what to do:`` line in every view
    and sent as ``lora_otel.diagnosis.advice``."""


ADVICE = "what to do: "
"""How every view begins the advice's line (the job's lines, inspect, watch, the report)."""


def advice_line(advice: str) -> str:
    """``what to do: <advice>``, the line every view shows under the why; "" without advice."""
    return ADVICE + advice if advice.strip() else ""


def diagnose(
    stall: Stall,
    evidence: dict[str, Any],
    journal: Optional[Journal] = None,
    peers: Iterable[Journal] = (),
    peer_stacks: Optional[Mapping[str, str]] = None,
    now_ns: Optional[int] = None,
    frozen_after_s: float = FROZEN_AFTER_S,
) -> str:
    """The sentence of `explain`."""
    return explain(stall, evidence, journal, peers, peer_stacks, now_ns, frozen_after_s).sentence


def explain(
    stall: Stall,
    evidence: dict[str, Any],
    journal: Optional[Journal] = None,
    peers: Iterable[Journal] = (),
    peer_stacks: Optional[Mapping[str, str]] = None,
    now_ns: Optional[int] = None,
    frozen_after_s: float = FROZEN_AFTER_S,
) -> Diagnosis:
    """The diagnosis of ``stall`` in ``journal``'s process from ``evidence`` (`evidence.gather`).

    ``peers``: the journals of the job's other processes; ``peer_stacks``: the Python stacks of some
    of them now, by journal path. Both serve only a process waiting inside a collective.
    """
    with ages.collecting() as grown:
        facts = Facts.of(stall, evidence, journal, peers, peer_stacks, now_ns, frozen_after_s)
        for rule in RULES:
            found = rule.check(facts)
            if found is not None:
                found.attrs.setdefault("lora_otel.diagnosis.rule", rule.name)
                if found.advice:
                    found.attrs["lora_otel.diagnosis.advice"] = found.advice
                handler = exit_handler(stall, facts.stacks) if rule.name != "exit joins" else ""
                if handler:
                    found.sentence = handler + found.sentence
                if facts.from_sample and rule.name != "cannot tell":
                    found.sentence = found.sentence.rstrip() + " " + _sample_note(facts)
                    found.attrs["lora_otel.diagnosis.from"] = "the beat's sample of the main thread"
                found.sentence, found.ages = ages.resolve(found.sentence, grown)
                return found
    raise AssertionError("the last rule always answers")  # pragma: no cover


# --- the rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What every rule reads: the stall, the evidence and the job around it, read once."""

    stall: Stall
    evidence: Mapping[str, Any]
    journal: Optional[Journal]
    peers: tuple[Journal, ...]
    peer_stacks: Mapping[str, str]
    now_ns: int
    frozen_after_s: float
    stacks: str  # faulthandler's dump, then py-spy's
    state: str  # /proc/<pid>/stat state letter and word ("S (sleeping)")
    wchan: str  # kernel wait channel
    innermost: str  # the main thread's innermost Python frame, "" when none
    conns: tuple[str, ...]  # ESTABLISHED TCP connections
    on_network: bool  # blocked on a socket (stack, wait channel, or a connection and a poll)
    from_sample: bool = False  # no stacks could be had: ``stacks`` is the beat's main-thread sample

    @classmethod
    def of(
        cls,
        stall: Stall,
        evidence: Mapping[str, Any],
        journal: Optional[Journal] = None,
        peers: Iterable[Journal] = (),
        peer_stacks: Optional[Mapping[str, str]] = None,
        now_ns: Optional[int] = None,
        frozen_after_s: float = FROZEN_AFTER_S,
    ) -> Facts:
        stacks = stacks_text(evidence)
        sample = sampled_stacks(journal) if journal is not None and not stacks.strip() else ""
        stacks = sample or stacks
        state = str(evidence.get(PREFIX + "process.state") or "")
        wchan = str(evidence.get(PREFIX + "process.wait_channel") or "")
        conns = tuple(c for c in evidence.get(PREFIX + "net.tcp_connections") or () if c.endswith("ESTABLISHED"))
        on_network = (
            any(m in stacks for m in _NET_MARKERS)
            or wchan.startswith(_NET_WCHAN)
            or (bool(conns) and state.startswith("S") and wchan.split(".", 1)[0] in _POLL_WCHAN)
        )
        return cls(
            stall,
            evidence,
            journal,
            tuple(peers),
            peer_stacks or {},
            time.time_ns() if now_ns is None else now_ns,
            frozen_after_s,
            stacks,
            state,
            wchan,
            _innermost_frame(stacks),
            conns,
            on_network,
            bool(sample),
        )


def sampled_stacks(journal: Journal) -> str:
    """The beat's last sample of the main thread (``main_frames``: at most four ``[file, line,
    function]``, outermost first) as a faulthandler dump of that one thread, for the rules to read
    when no stacks could be had (no handler, the request refused, py-spy absent); '' when none. A
    called C function's entry (``["", 0, "time.sleep"]``) is left out: its caller is the place."""
    frames = journal.main_frames
    rows = [f for f in frames or () if isinstance(f, list) and len(f) == 3 and f[0]]
    if not rows:
        return ""
    lines = ["Current thread 0x%016x (most recent call first):" % 0]
    lines += ['  File "%s", line %s in %s' % (file, line, func) for file, line, func in reversed(rows)]
    if rows[0][2] != "<module>":  # the sample keeps the innermost frames: the main thread's outer ones are cut
        lines.append('  File "(outer frames not sampled)", line ??? in <module>')
    return "\n".join(lines)


class Rule(NamedTuple):
    """One cause: its name (``lora_otel.diagnosis.rule`` on the stall), the evidence it needs, an
    example of its sentence (docs/stalls.md's table is checked against these), and the check,
    which returns a `Diagnosis` when the evidence shows this cause and None otherwise."""

    name: str
    needs: str
    example: str
    check: Callable[[Facts], Optional[Diagnosis]]
    advice: str = ""
    """An example of its advice (`Diagnosis.advice`), "" for a rule that gives none (docs/stalls.md's
    "what to do" column is checked against it)."""


def _said(text: Optional[str]) -> Optional[Diagnosis]:
    return None if text is None else Diagnosis(text)


def _root_int(journal: Optional[Journal], key: str) -> Optional[int]:
    """An integer attribute of the journal's root span (``process.parent_pid``), None when none."""
    value = journal.root.attrs.get(key) if journal is not None and journal.root is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _env(journal: Optional[Journal], name: str) -> str:
    """A variable of the job's environment as its self-check recorded it (``lora_otel.env.NAME`` on
    the root span, `lora_otel._boot.envfacts`); "" when not recorded."""
    value = (
        journal.root.attrs.get("lora_otel.env." + name) if journal is not None and journal.root is not None else None
    )
    return value.strip() if isinstance(value, str) else ""


def _zombie(f: Facts) -> Optional[Diagnosis]:
    if f.state.startswith("Z"):
        parent = _root_int(f.journal, "process.parent_pid")
        return Diagnosis(
            "The process has ended; its parent has not reaped it yet (a zombie).",
            advice="Its parent%s must reap it (wait for it: Popen.wait(), os.waitpid()); a zombie cannot be "
            "killed itself — ending the parent lets the system reap it." % (" (pid %d)" % parent if parent else ""),
        )
    return None


def _stopped(f: Facts) -> Optional[Diagnosis]:
    if f.state.startswith("T"):
        background = background_read(f.evidence)
        if background is not None:
            return Diagnosis(background.sentence, advice=background.advice)
        pid = f.journal.pid if f.journal is not None else None
        return Diagnosis(
            "The process is stopped (SIGSTOP or a debugger), not running at all.",
            advice="Resume it: kill -CONT %s (a job stopped with Ctrl-Z in a shell: fg)." % (pid or "<pid>"),
        )
    return None


def _memory(f: Facts) -> Optional[Diagnosis]:
    found = memory_pressure(f.evidence)
    if found is None:
        return None
    limit = f.evidence.get(PREFIX + "memory.limit_bytes")
    more = (
        "raise the job's memory limit (%s now%s)"
        % (
            _mb(limit),
            ", %s" % f.evidence[PREFIX + "memory.limit_from"] if f.evidence.get(PREFIX + "memory.limit_from") else "",
        )
        if isinstance(limit, int) and not isinstance(limit, bool)
        else "free memory on the machine"
    )
    return Diagnosis(
        found, advice="Give it the memory it needs — %s — or make it need less: a smaller batch size." % more
    )


def _full_pipe(f: Facts) -> Optional[Diagnosis]:
    frozen, pid = f.stall.kind == "frozen", f.journal.pid if f.journal is not None else None
    found = full_pipe(f.evidence, f.innermost, frozen, pid)
    if found is None:
        return None
    return Diagnosis(found, advice=pipes.advice(f.evidence, frozen, pid, _root_int(f.journal, "process.parent_pid")))


def _disk(f: Facts) -> Optional[Diagnosis]:
    waiting = main_wait(f.evidence)
    if waiting is not None and network_mount(waiting) is not None:
        return None  # a file on a network or FUSE mount: the "descriptor wait" rule names the mount
    if f.state.startswith("D"):
        wchan = f.wchan or "unknown"
        return Diagnosis("The process is in uninterruptible disk I/O (kernel wait channel %s)." % wchan)
    return None


def _file_lock(f: Facts) -> Optional[Diagnosis]:
    main = _main_thread(f.stacks) or []
    # The program's call that waits: the caller of the outermost filelock frame (a poll caught inside
    # os.stat or pathlib is not the place), else the innermost Python frame.
    locking = [i for i, fr in enumerate(main) if _in(fr.file.replace("\\", "/"), "filelock/")]
    callers = main[locking[-1] + 1 :] if locking else main
    where = next((_short(fr) for fr in callers if fr.python), "")
    found = filelocks.sentence(f.evidence, where)
    if found is None:
        return None
    attrs: dict[str, Any] = {}
    for key in ("path", "holder_pid"):
        value = f.evidence.get(filelocks.KEY + key)
        if value is not None:
            attrs["lora_otel.file_lock." + key] = value
    return Diagnosis(
        found, attrs, advice=filelocks.advice(f.evidence, f.journal.pid if f.journal is not None else None)
    )


def _hub(f: Facts) -> Optional[Diagnosis]:
    if "huggingface_hub" in f.stacks and f.on_network:
        return Diagnosis(
            "Waiting on the network inside huggingface_hub (a hub download or API call)%s."
            % ("; connection %s" % f.conns[0] if f.conns else ""),
            advice=hubcache.advice(f.evidence),
        )
    return None


def _in_collective(f: Facts) -> Optional[Diagnosis]:
    collective = collective_in(f.stacks)
    if collective is None:
        return None
    return _collective(collective, f.journal, list(f.peers), f.peer_stacks, f.now_ns, f.frozen_after_s)


def _dataloader(f: Facts) -> Optional[Diagnosis]:
    by_pid = {j.pid: j for j in f.peers if j.pid is not None}
    found = dataloader_wait(f.stacks, f.evidence, f.stall, by_pid)
    if found is None:
        return None
    for row in f.evidence.get(PREFIX + "process.children") or ():  # a worker stuck in a pool lost in its fork
        if not isinstance(row, dict):
            continue
        pid = row.get("pid")
        lost = native.worker_native(row, by_pid.get(pid) if isinstance(pid, int) else None, dataloader=True)
        if lost is not None and lost.advice:
            return Diagnosis(found, dict(lost.attrs), advice=lost.advice)
    stuck = _busy_workers(f.evidence) if found.startswith("The main thread waits for a DataLoader batch") else []
    pids = [str(k.get("pid")) for k in stuck[:MAX_NAMED]]
    return Diagnosis(
        found,
        advice="See where worker %s %s (py-spy dump --pid %s); to confirm that the dataset's own code hangs, "
        "run with num_workers=0: it then runs in the main process, and the stall names its line."
        % (
            "pid %s" % pids[0] if len(pids) == 1 else "pids %s and %s" % (", ".join(pids[:-1]), pids[-1]),
            "is" if len(pids) == 1 else "are",
            pids[0],
        )
        if stuck
        else "",
    )


def _busy_workers(evidence: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The DataLoader workers (`dataloader_wait`'s) that are not waiting for work: in the dataset's
    code as read from outside, running, in disk I/O, or waiting elsewhere than a worker's idle wait."""
    kids = [k for k in evidence.get(PREFIX + "process.children") or () if isinstance(k, dict) and "pid" in k]
    workers = [
        k
        for k in kids
        if "multiprocessing" in str(k.get("cmdline", "")) or "journal" in k or str(k.get("cmdline", "")) == ""
    ] or kids
    return [
        k
        for k in workers
        if _in_work(k) or k.get("state") in ("R", "D") or not str(k.get("wchan", "")).startswith(_IDLE_WORKER_WCHAN)
    ]


_OTHER_RULES_IPC = ("torch/distributed/", "multiprocessing/", "multiprocess/", "concurrent/futures/")


def _descriptor_wait(f: Facts) -> Optional[Diagnosis]:
    """The main thread blocked in a read, write or open on a descriptor or path, or waiting for a
    child, and what is at the other end along the chain of waits (`lora_otel.analysis.waits`)."""
    main = _main_thread(f.stacks) or []
    if any(_in(fr.file.replace("\\", "/"), module) for fr in main for module in _OTHER_RULES_IPC):
        # a rank's store or collective socket, a multiprocessing queue or pool's pipe: the collective,
        # rendezvous and worker pool rules tell these from the workers' and ranks' own journals
        return None
    where, calls = f.innermost, []
    caller = _program_call(f.stacks)  # the program's own call, before the library frame it waits in
    if caller and caller != where and where:
        where = "%s → %s" % (caller, where)
    sampled = f.journal.main_frames if f.journal is not None else None
    last = sampled[-1] if sampled and isinstance(sampled[-1], list) and len(sampled[-1]) == 3 else None
    if last is not None and not last[0] and last[2]:  # a C function the beat saw it call (input, os.read)
        calls.append(str(last[2]))
        if where:
            where += " → %s" % last[2]
    first = next((fr for fr in main if fr.python), None)
    if first is not None:
        calls.append(_source(first))
    found = descriptor_wait(f.evidence, where, f.journal.pid if f.journal is not None else None, calls)
    if found is None:
        return None
    attrs: dict[str, Any] = {}
    if found.end_pid is not None:
        attrs["lora_otel.diagnosis.wait_end_pid"] = found.end_pid
    return Diagnosis(found.sentence, attrs, advice=found.advice)


def _process_lock(f: Facts) -> Optional[Diagnosis]:
    main = _main_thread(f.stacks) or []
    if mplocks.semlock_wait(main) is None:
        return None
    others = [
        _thread_name(frames)
        for _, frames in _threads(f.stacks)
        if frames != main
        and not _idle_helper(frames)
        and any(fr.python and "lora_otel/_boot/" not in fr.file.replace("\\", "/") for fr in frames)
    ]
    children = f.evidence.get(PREFIX + "process.children") or ()
    found = mplocks.lock_wait(main, f.journal, f.peers, children, _source, _holds(main), others)
    return Diagnosis(found.sentence, advice=found.advice) if found is not None else None


def _worker_pool(f: Facts) -> Optional[Diagnosis]:
    main = _main_thread(f.stacks) or []
    frames = [(frame.file, frame.line, frame.func) for frame in main if frame.python]
    children = f.evidence.get(PREFIX + "process.children") or ()
    # its other threads, from its stacks (None: not read): a thread pool's workers are among them
    threads = [
        (head, [(fr.file, fr.line, fr.func) for fr in frames if fr.python])
        for head, frames in _threads(f.stacks)
        if frames is not main
    ]
    found = pool_wait(
        frames,
        f.journal,
        f.peers,
        children,
        f.stall.open_for_s,
        f.now_ns,
        threads if main else None,
        f.evidence.get(PREFIX + "wait.threads"),
    )
    if found is None:
        return None
    sentence, attrs = found
    return Diagnosis(sentence, attrs, advice=str(attrs.pop(POOL_ADVICE, "")))


EXIT_STAGE = "exit"
_EXIT_JOINS = (("threading.py", "_shutdown"), ("concurrent/futures/thread.py", "_python_exit"))
"""Where the interpreter's exit joins the program's threads: every non-daemon thread, and a
``ThreadPoolExecutor``'s workers (``threading._register_atexit``)."""
MAX_NAMED_THREADS = 3


def _exit_joins(f: Facts) -> Optional[Diagnosis]:
    """The ``exit`` stage, its main thread joining threads the program left running: which ones
    (the span's ``lora_otel.exit.threads``) and where each of them is."""
    if f.stall.span.name != EXIT_STAGE:
        return None
    main = _main_thread(f.stacks) or []
    if not any(_in(fr.file.replace("\\", "/"), file) and fr.func == func for fr in main for file, func in _EXIT_JOINS):
        return None
    named = f.stall.span.attrs.get("lora_otel.exit.threads")
    names = [str(n) for n in named if isinstance(n, str)] if isinstance(named, list) else []
    busy = [
        frames
        for _, frames in _threads(f.stacks)
        if frames != main and not _idle_helper(frames) and any(fr.python for fr in frames)
    ]
    where = "; ".join(
        "%s is at %s" % (_thread_name(frames), _short(next(fr for fr in frames if fr.python)))
        for frames in busy[:MAX_NAMED_THREADS]
    )
    threads = (
        ", ".join(names[:MAX_NAMED_THREADS])
        if names
        else ", ".join("%s at %s" % (_thread_name(fr), _short(next(x for x in fr if x.python))) for fr in busy[:1])
    )
    many = len(names[:MAX_NAMED_THREADS]) > 1
    advice = (
        "Make %s %s (threading.Thread(..., daemon=True)), or end %s loop%s and join %s before the program returns."
        % (
            ("threads %s" if many else "thread %s") % threads if names else threads,
            "daemon threads" if many else "a daemon thread",
            "their" if many else "its",
            "s" if many else "",
            "them" if many else "it",
        )
        if threads
        else ""
    )
    return Diagnosis(
        "The interpreter's exit waits for threads the program left running (threading._shutdown joins "
        "every non-daemon thread%s)%s. The process ends only when they do: end them before the program "
        "returns, or make them daemon threads."
        % (": %s" % ", ".join(names[:MAX_NAMED_THREADS]) if names else "", "; " + where if where else ""),
        advice=advice,
    )


def exit_handler(stall: Stall, stacks: str) -> str:
    """``"The exit runs an atexit handler, flush() in train.py. "``: in the ``exit`` stage, the
    handler the main thread is in (its outermost frame: atexit calls it from C), to put before the
    cause; "" otherwise."""
    if stall.span.name != EXIT_STAGE:
        return ""
    main = _main_thread(stacks) or []
    outer = [fr for fr in main if fr.python]
    if not outer or outer[-1].func == "<module>" or any(_in(fr.file, "threading.py") for fr in outer[-1:]):
        return ""
    return "The exit runs an atexit handler, %s() in %s. " % (outer[-1].func, _package_path(outer[-1].file))


def _locks(f: Facts) -> Optional[Diagnosis]:
    joined = threadwaits.join_wait(_threads(f.stacks))
    if joined is not None:  # a join is the thread's end, not a lock: say which thread, and where it is
        return Diagnosis(joined)
    found = lock_waits(f.stacks)
    if found is None:
        return None
    return Diagnosis(found, advice=deadlock_advice(f.stacks) if found.startswith("Deadlock: ") else "")


def _thread_ended(f: Facts) -> Optional[Diagnosis]:
    errors = threadends.thread_errors(f.journal)
    if not errors:
        return None
    main = [fr for fr in _main_thread(f.stacks) or [] if fr.python]
    if not main or not (main[0].func == "wait" and _in(main[0].file, "threading.py")):
        return None  # not in Condition.wait (an Event's, a Queue's): some other wait
    sentence, advice = threadends.told(_event_wait(main), errors)
    return Diagnosis(sentence, advice=advice)


def _thread_deadlock(f: Facts) -> Optional[Diagnosis]:
    found = threadwaits.deadlock(_threads(f.stacks), _source)
    return Diagnosis(found.sentence, advice=found.advice) if found is not None else None


def _cuda_init(f: Facts) -> Optional[Diagnosis]:
    if "torch/cuda/__init__.py" in f.stacks and "_lazy_init" in f.stacks:
        return Diagnosis("Inside CUDA driver initialisation (torch.cuda._lazy_init).")
    return None


def _network(f: Facts) -> Optional[Diagnosis]:
    if not f.on_network:
        return None
    accepting = accept_wait(f.stacks, f.evidence)
    if accepting is not None:
        return Diagnosis(accepting)
    connecting = connect_wait(f.evidence, f.stall, f.innermost, _program_call(f.stacks))
    if connecting is not None:
        return Diagnosis(connecting)
    quiet = network_quiet(f.evidence, f.stall)
    if quiet is not None:
        return Diagnosis(quiet)
    return Diagnosis("Waiting on the network (%s)." % (f.innermost or "a socket call"))


_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", "<string>")
"""A frame whose file has one of these is a library's or Python's own, not the program's."""


def _program_call(stacks: str) -> str:
    """``job.py:13 in <module>``: the main thread's innermost Python frame of the program's own
    files (outside Python's library and installed packages); "" when none."""
    main = _main_thread(stacks) or []
    return next(
        (_short(fr) for fr in main if fr.python and not any(p in fr.file.replace("\\", "/") for p in _LIBRARY_PARTS)),
        "",
    )


def connect_wait(evidence: Mapping[str, Any], stall: Stall, innermost: str, caller: str = "") -> Optional[str]:
    """``Connecting to 10.0.0.5:443 with no answer …`` when the process holds a TCP socket in
    SYN_SENT (a connect the other side never answered); else None. ``caller``: the program's own
    frame that made the call (`_program_call`), named before the library frame it waits in."""
    syn = [str(c) for c in evidence.get(PREFIX + "net.tcp_connections") or () if str(c).endswith(" SYN_SENT")]
    remotes = sorted({c.split(" -> ", 1)[1].rsplit(" ", 1)[0] for c in syn if " -> " in c})
    if not remotes:
        return None
    return (
        "Connecting to %s with no answer (SYN sent, nothing back: an address that drops packets — a "
        "black-holed endpoint, a firewall, a host that is down)%s; the stall has lasted %s."
        % (
            ", ".join(remotes[:3]),
            " at %s" % " → ".join(x for x in (caller if caller != innermost else "", innermost) if x)
            if innermost or caller
            else "",
            ages.growing(stall.open_for_s * 1e9),
        )
    )


def _rendezvous(f: Facts) -> Optional[Diagnosis]:
    """The main thread is in ``init_process_group``'s rendezvous (its TCPStore connecting or
    waiting for the world to join): the other ranks are what it waits for — one never started (a
    ``WORLD_SIZE`` left in the environment), still loading, or unable to reach the store's address.
    TCPStore retries with a C++ sleep: without this rule that read as a ``time.sleep``."""
    main = _main_thread(f.stacks) or (_threads(f.stacks)[0][1] if _threads(f.stacks) else None)
    if not main or not any(
        _in(fr.file.replace("\\", "/"), "torch/distributed/rendezvous.py")
        or (fr.func == "init_process_group" and _in(fr.file.replace("\\", "/"), "torch/distributed/"))
        for fr in main
    ):
        return None
    called = next((_short(fr) for fr in main if fr.python and not _in(fr.file.replace("\\", "/"), "torch/")), "")
    rank = _rank(f.journal) if f.journal is not None else None
    world = _rank(f.journal, "world_size") if f.journal is not None else None
    who = (
        "rank %d of world size %d waits" % (rank, world)
        if rank is not None and world is not None
        else "this process waits"
    )
    return Diagnosis(
        "Waiting in torch.distributed's rendezvous (init_process_group%s): %s for the other ranks to reach "
        "the store (MASTER_ADDR:MASTER_PORT) — a rank that was never started (WORLD_SIZE or RANK left in the "
        "environment), is still starting, or cannot reach that address keeps every rank here."
        % (", at %s" % called if called else "", who),
        advice=_rendezvous_advice(f, rank, world),
    )


def _rendezvous_advice(f: Facts, rank: Optional[int], world: Optional[int]) -> str:
    """The ranks that must be started (of the world, those with no journal in the job), and the
    address they must reach (the recorded MASTER_ADDR:MASTER_PORT); "" when neither is known."""
    store = _store(f.journal)
    if rank is None or world is None or world > 4096:
        return "Every rank must reach %s (MASTER_ADDR:MASTER_PORT)." % store if store else ""
    seen = set(world_peers(f.journal, f.peers)) | {rank}
    unseen = sorted(set(range(world)) - seen)
    reach = " with MASTER_ADDR and MASTER_PORT that reach %s" % store if store else ""
    if unseen:
        return (
            "Start %s of world size %d%s (this one is rank %d); if this job was meant to run alone, "
            "unset WORLD_SIZE and RANK in its environment." % (_ranks(unseen), world, reach, rank)
        )
    if store:
        return "Every rank of the %d is running: check that each one can reach %s (MASTER_ADDR:MASTER_PORT)." % (
            world,
            store,
        )
    return ""


_SLEEP_WCHAN = ("hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep", "schedule_hrtimeout")
"""Kernel wait channels of a task in ``time.sleep`` (``clock_nanosleep``)."""
_SELECT_WCHAN = ("do_select", "core_sys_select", "poll_schedule_timeout")
"""Kernel wait channels of ``select()``, where ``time.sleep`` waits on Python 3.9 and 3.10."""


def _asleep(f: Facts) -> bool:
    """The main thread is in ``time.sleep``: its wait channel, or the beat's sample ending there."""
    if f.stall.kind == "frozen":
        return False
    sampled = f.journal.main_frames if f.journal is not None else None
    last = sampled[-1] if sampled and isinstance(sampled[-1], list) and len(sampled[-1]) == 3 else None
    in_sleep = last is not None and last[2] == "time.sleep"
    # (Python 3.9 and 3.10 sleep in select(): a select wait channel, with the beat's sample in
    # time.sleep, is a sleep.)
    return f.wchan.startswith(_SLEEP_WCHAN) or (in_sleep and (not f.wchan or f.wchan.startswith(_SELECT_WCHAN)))


def _poll_loop(f: Facts) -> Optional[Diagnosis]:
    """A sleep in a loop whose polled object the evidence names (`lora_otel.analysis.polling`):
    what it is, its state, and the step that state supports. A loop paced by a timed wait
    (``while not os.path.exists(p): stop.wait(1)``) too, but for a flag, which the thread locks
    rule reads better (who could set it)."""
    paced = f.evidence.get(polling.KEY + "paced_by")
    if paced == "wait":
        if f.stall.kind == "frozen" or not f.state.startswith("S") or f.evidence.get(polling.KEY + "kind") == "flag":
            return None
    elif not _asleep(f):
        return None
    found = polling.sentence(f.evidence, f.now_ns)
    if found is None:
        return None
    attrs: dict[str, Any] = {}
    for key in ("kind", "value"):
        value = f.evidence.get(polling.KEY + key)
        if isinstance(value, (str, int, float)):
            attrs["lora_otel.poll." + key] = value
    return Diagnosis(found[0], attrs, advice=found[1])


def _sleeping(f: Facts) -> Optional[Diagnosis]:
    if not _asleep(f):
        return None
    sampled = f.journal.main_frames if f.journal is not None else None
    last = sampled[-1] if sampled and isinstance(sampled[-1], list) and len(sampled[-1]) == 3 else None
    in_sleep = last is not None and last[2] == "time.sleep"
    where = f.innermost
    if not where and sampled and in_sleep and len(sampled) >= 2 and isinstance(sampled[-2], list):
        file, line, func = [*sampled[-2], "", "", ""][:3]
        where = "%s:%s in %s" % (str(file).replace("\\", "/").rsplit("/", 1)[-1], line, func)
    return Diagnosis(
        "The main thread is sleeping (time.sleep)%s: a wait the program chose — a back-off or retry "
        "loop, a poll for a file or a condition, or a sleep left in the code — not a lock, the network "
        "or the GPU." % (" at %s" % where if where else "")
    )


def _frozen(f: Facts) -> Optional[Diagnosis]:
    if f.stall.kind != "frozen":
        return None
    where = "; last Python frame: %s" % f.innermost if f.innermost else ""
    sampled = f.evidence.get(PREFIX + "process.cpu_percent")
    cpu = float(sampled) if isinstance(sampled, (int, float)) else 0.0
    busy = cpu > 50
    dump = str(f.evidence.get(PREFIX + "py_spy.dump") or "")
    held = gil_held(dump)
    own = _own_native(f)
    lib = own if own is not None and "lora_otel.native.library" in own.attrs else None
    if lib is not None:  # which library it is in: "…; the main thread waits in NCCL (libnccl.so.2) …"
        where += "; %s%s" % (lib.phrase[0].lower(), lib.phrase[1:])
    if held is not None:
        if busy:
            return Diagnosis(
                "Holding the GIL in native code and busy on the CPU (%.0f %%)%s (%s)." % (cpu, where, held),
                dict(lib.attrs) if lib else {},
                advice=lib.advice if lib else "",
            )
        return Diagnosis(
            "Holding the GIL in native code while blocked (wait channel %s)%s (%s)."
            % (f.wchan or "unknown", where, held),
            dict(lib.attrs) if lib else {},
            advice=lib.advice if lib else "",
        )
    # The stall itself says "no beat for N s" (frozen): the sentence says what else is known.
    doing = (
        "Busy on the CPU (%.0f %%)" % cpu
        if busy
        else "Blocked in the kernel (wait channel %s)" % (f.wchan or "unknown")
    )
    if has_native_stacks(dump):
        unknown = "py-spy's native stacks do not show which thread holds the GIL"
    else:
        error = str(f.evidence.get(PREFIX + "py_spy.error") or f.evidence.get(PREFIX + "py_spy.native_error") or "")
        unknown = "whether it holds the GIL is unknown without native stacks (%s)" % (
            "py-spy: %s" % error if error else "py-spy, `pip install lora-otel[pyspy]`"
        )
    return Diagnosis(
        "%s%s; %s." % (doing, where, unknown), dict(lib.attrs) if lib else {}, advice=lib.advice if lib else ""
    )


def _own_native(f: Facts) -> Optional[native.WorkerNative]:
    """The stalled process's own wait in native code (`native.worker_native` as `native.PROCESS`):
    its main thread's native frames (py-spy ``--native``, read for a frozen process or one whose
    main thread waits in a known library's own call) and its threads' system calls."""
    calls = f.evidence.get(PREFIX + "native.syscalls") or []
    dump = str(f.evidence.get(PREFIX + "py_spy.dump") or "")
    frames = native.main_thread_frames(dump) if has_native_stacks(dump) else []
    pid = f.journal.pid if f.journal is not None else None
    if pid is None and calls and isinstance(calls[0], (list, tuple)) and calls[0]:
        pid = calls[0][0]
    row = {
        "pid": pid,
        "native": [list(fr) for fr in frames],
        "syscalls": calls,
        "libraries": f.evidence.get(PREFIX + "native.libraries") or [],
        "native_error": f.evidence.get(PREFIX + "py_spy.native_error") or f.evidence.get(PREFIX + "py_spy.error"),
        "state": f.state[:1],
    }
    return native.worker_native(row, f.journal, who=native.PROCESS)


def _native_wait(f: Facts) -> Optional[Diagnosis]:
    if f.stall.kind == "frozen":
        return None  # (`_frozen` says whether it holds the GIL, and names the library)
    found = _own_native(f)
    if found is None or "lora_otel.native.library" not in found.attrs:
        return None
    cpu = f.evidence.get(PREFIX + "process.cpu_percent")
    busy = " (busy on the CPU: %.0f %%)" % cpu if f.state.startswith("R") and isinstance(cpu, (int, float)) else ""
    return Diagnosis(found.phrase + busy + ".", dict(found.attrs), advice=found.advice)


def _sample_age(f: Facts) -> str:
    ts = f.journal.main_frames_ts if f.journal is not None else None
    return " (%s old)" % ages.growing(f.now_ns - ts) if isinstance(ts, int) else ""


def _no_stacks_why(f: Facts) -> str:
    why = str(f.evidence.get(PREFIX + "python.stacks.error") or "").strip().rstrip(".")
    return " (%s)" % why if why else ""


def _sample_note(f: Facts) -> str:
    """``(Read from the beat's last sample of the main thread (2.1 s old): no stack dump to read
    (not requested: …).)``, after a sentence a rule built from that sample."""
    return "(Read from the beat's last sample of the main thread%s: no stack dump to read%s.)" % (
        _sample_age(f),
        _no_stacks_why(f),
    )


def _cannot_tell(f: Facts) -> Optional[Diagnosis]:
    if f.from_sample and f.innermost:
        return Diagnosis(
            "Cannot tell why; no stack dump to read%s, and the beat's last sample of the main thread%s "
            "ends at %s." % (_no_stacks_why(f), _sample_age(f), f.innermost)
        )
    if f.innermost:
        return Diagnosis("Cannot tell why; the innermost Python frame is %s." % f.innermost)
    return Diagnosis("Cannot tell from the evidence.")


RULES: tuple[Rule, ...] = (
    Rule(
        "zombie",
        "/proc/<pid>/stat state Z",
        "The process has ended; its parent has not reaped it yet (a zombie).",
        _zombie,
        "Its parent (pid 4711) must reap it (wait for it: Popen.wait(), os.waitpid()); ...",
    ),
    Rule(
        "stopped",
        "/proc/<pid>/stat state T",
        "The process is stopped (SIGSTOP or a debugger), not running at all.",
        _stopped,
        "Resume it: kill -CONT 4712 (a job stopped with Ctrl-Z in a shell: fg).",
    ),
    Rule(
        "memory pressure",
        "major faults/s >= 50, swap-ins/s >= 50 or memory PSI some avg10 >= 10 %",
        "Loading is slowed by swapping: RSS 3900 MB against a memory limit of 4000 MB, ...",
        _memory,
        "Give it the memory it needs — raise the job's memory limit (4000 MB now, ...) — or make it need less: ...",
    ),
    Rule(
        "full pipe",
        "a thread of the job in a pipe write (wait channel anon_pipe_write); fd 1/2 a pipe, its fill "
        "(FIONREAD), the processes holding its read end (/proc/*/fd) and their wait channels",
        "Blocked writing to its stdout, a pipe nobody reads: the main thread waits in anon_pipe_write; "
        "pipe:[34094] holding 64000 of its 65536 bytes; its read end is held by pid 4711 ...",
        _full_pipe,
        "The program that started this job (pid 4711 python ui.py) must read the job's stdout while the job runs ...",
    ),
    Rule(
        "disk I/O",
        "/proc/<pid>/stat state D, wait channel",
        "The process is in uninterruptible disk I/O (kernel wait channel ...).",
        _disk,
    ),
    Rule(
        "file lock",
        "/proc/locks (a blocked request, the holder's pid), the process's fds; for a polled lock the "
        "stack (filelock, a sleep loop) and its locals (py-spy)",
        "Waiting for a file lock on /data/.locks/model.lock (filelock polls it, at job.py:5 in <module>), "
        "held by pid 4711 (python prefetch.py).",
        _file_lock,
        "Wait for pid 4711 (python prefetch.py) to finish with /data/.locks/model.lock, or stop it ...",
    ),
    Rule(
        "hub download",
        "huggingface_hub on the stack and a socket wait",
        "Waiting on the network inside huggingface_hub (a hub download or API call); connection ...",
        _hub,
        "gpt2 is in the local Hugging Face cache already (...): start the job with HF_HUB_OFFLINE=1 ...",
    ),
    Rule(
        "collective",
        "a torch.distributed collective on the stack; the other ranks' journals and stacks files",
        "Waiting inside a collective (all_reduce, called at train.py:17 in <module>); rank 1 never arrived: ...",
        _in_collective,
        "Find out why rank 1 (pid 4712 on node-2) did not reach all_reduce: `lora-otel inspect ...` ...",
    ),
    Rule(
        "DataLoader",
        "torch/utils/data/ on the main thread's stack; /proc/<pid>/task/*/children",
        "The main thread waits for a DataLoader batch (at job.py:18 in <module>) for 4 s; worker pid ...",
        _dataloader,
        "See where worker pid 4711 is (py-spy dump --pid 4711); ... run with num_workers=0 ...",
    ),
    Rule(
        "thread deadlock",
        "each thread's stack: Thread.join and the one other thread it can join; importlib's module lock "
        "(_ModuleLock.acquire) and the thread whose <module> frames hold it (the module from the waiter's "
        "source line); a wait on a pool's results and the pool's handler or worker threads; Event.wait, Queue.get "
        "and the one other thread that could set or fill it",
        "Deadlock between threads: the main thread, importing foomodule, waits at foomodule.py:6 in <module> for "
        "thread baz() to end (Thread.join); thread baz() waits at barmodule.py:2 in baz for the import of "
        "foomodule, which the main thread is running (...); none of them can go on.",
        _thread_deadlock,
        "Do not start threads or pools and wait for them while a module is being imported: move the work at "
        "foomodule.py:6 (the top level of foomodule, run by its import) into a function the program calls after "
        'the import, or under `if __name__ == "__main__":`.',
    ),
    Rule(
        "descriptor wait",
        "the main thread's system call (/proc/<pid>/task/<tid>/syscall: read, write, open, wait4) and its "
        "descriptor (/proc/<pid>/fd, fdinfo, mountinfo) or path; the processes at its other end (/proc/*/fd, "
        "/proc/net/tcp, sock_diag) and their own waits, along the chain",
        "The main thread waits to read its standard input (fd 0, a pipe) at job.py:7 in <module> → input (read); "
        "its write end is held by pid 4711 (`python ui.py`), which waits for its child this job (pid 4712) ...",
        _descriptor_wait,
        "The program asks for input on its standard input (...): answer it, or pass the program's option that "
        "skips the prompt; started from a UI or a script, its standard input must be /dev/null ...",
    ),
    Rule(
        "process lock",
        "the main thread in multiprocessing's synchronize (SemLock __enter__/acquire); its children's ends (child "
        "exit events, their journals' last beat sample and exit records, /proc/<pid>/task/*/children)",
        "The main thread waits for a multiprocessing lock (lock) at job.py:22 in <module> — a semaphore shared "
        "between processes; its child pid 4711 was killed by SIGKILL at 2026-12-07T12:00:03.120Z, and no other "
        "child of it is alive to release it: a process killed while holding a multiprocessing lock never "
        "releases it ...",
        _process_lock,
        "Restart the job: the lock cannot be freed now. Find why pid 4711 was killed (the OOM killer, a timeout) ...",
    ),
    Rule(
        "worker pool",
        "the main thread waits in a pool (multiprocessing, concurrent.futures, subprocess); its workers' journals, "
        "child exit events and /proc/<pid>/task/*/children; a worker's native frames (py-spy --native), its threads' "
        "system calls against its maps, and a forked one's process.fork.parent_threads",
        "The main thread waits for its multiprocessing.Pool (map, called at job.py:9 in <module>) for 25 s; worker "
        "pid 4711 holds a task: its main thread has been at job.py:5 in task → time.sleep for 24 s ...",
        _worker_pool,
        "Start the workers with the spawn start method (multiprocessing.set_start_method('spawn')) ..., or keep "
        "the parent to one thread before it forks: OMP_NUM_THREADS=1 ...",
    ),
    Rule(
        "exit joins",
        "the exit stage's main thread in threading._shutdown (or concurrent.futures' exit join); the span's "
        "lora_otel.exit.threads; the other threads' stacks",
        "The interpreter's exit waits for threads the program left running (threading._shutdown joins every "
        "non-daemon thread: uploader); thread upload() is at job.py:5 in upload. ...",
        _exit_joins,
        "Make thread uploader a daemon thread (threading.Thread(..., daemon=True)), or end its loop and join it ...",
    ),
    Rule(
        "poll loop",
        "the main thread asleep (as for sleeping), or in a timed wait (event.wait(1)); the while/for around "
        "the sleep in its source and its frames' locals (py-spy -ll, the beat's dump); the polled path's stat "
        "and openers (/proc/*/fd), a pid's /proc/<pid>/stat, a port's LISTEN socket (/proc/<pid>/net/tcp)",
        "The main thread polls for /data/.cache/x/lock to disappear (os.path.exists(self.lock_file_path) at "
        "file_baton.py:42 in wait, every 0.1 s); the file exists (...) and no process has it open: a leftover ...",
        _poll_loop,
        "Remove /data/.cache/ext/lock (no process has it open, so no run is using it) and the job goes on.",
    ),
    Rule(
        "thread ended",
        "the main thread in Event.wait, Queue.get or Condition.wait with no thread the stacks show to set or fill "
        "it; the job's thread exception events (a thread that ended by an uncaught exception: its name, the "
        "exception, where it was raised)",
        "Waiting for an event: the main thread waits in Queue.get() at job.py:22 in <module> for another thread to "
        "set or notify it; no thread the stacks show is doing so; thread prefetch ended at 2026-12-07T12:00:03.120Z "
        'by an uncaught OSError ("corrupt shard: data/shard-0003.tar") raised at job.py:12 in prefetch, so it will '
        "not put or set anything more.",
        _thread_ended,
        "Fix the OSError that thread prefetch raised at job.py:12 in prefetch; and make that thread pass its failure "
        "on — put a sentinel or the exception on the queue (or set the event) in an except or finally block — ...",
    ),
    Rule(
        "thread locks",
        "the source line of each thread's innermost frame (with lock:, lock.acquire() and the with blocks around it",
        "Deadlock: the main thread waits in lock_b.acquire at job.py:20 in <module> holding lock_a ...",
        _locks,
        "Take lock_b and lock_a in one order in every thread (the main thread takes lock_b at job.py:20 in <module> "
        "while holding lock_a; thread worker() takes lock_a at job.py:14 in worker while holding lock_b), ...",
    ),
    Rule(
        "CUDA init",
        "torch/cuda/__init__.py _lazy_init on the stack",
        "Inside CUDA driver initialisation (torch.cuda._lazy_init).",
        _cuda_init,
    ),
    Rule(
        "network",
        "a socket call on the stack, a socket wait channel, or an established connection and a poll; bytes read",
        "Waiting on the network: 10.0.0.5:443 has gone quiet (the process read 1.4 kB/s ...) ...",
        _network,
    ),
    Rule(
        "frozen",
        "no beat for the frozen limit; CPU %, wait channel; py-spy: a thread marked +gil or taking the GIL",
        "Holding the GIL in native code while blocked (wait channel futex_wait_queue) ... (py-spy shows thread 4711 "
        "(MainThread) holding it); without that: Blocked in the kernel (wait channel ...); "
        "whether it holds the GIL is unknown without native stacks ...",
        _frozen,
    ),
    Rule(
        "rendezvous",
        "the main thread inside torch.distributed's rendezvous (init_process_group, the TCPStore); rank and "
        "world size from the root span",
        "Waiting in torch.distributed's rendezvous (init_process_group, at train.py:12 in <module>): rank 0 of "
        "world size 2 waits for the other ranks to reach the store ...",
        _rendezvous,
        "Start rank 1 of world size 2 with MASTER_ADDR and MASTER_PORT that reach 10.0.0.1:29500 ...",
    ),
    Rule(
        "native wait",
        "the main thread's system call made from a known library's code (/proc/<pid>/task/<tid>/syscall against "
        "its maps), or its native frames (py-spy --native); a forked process's process.fork.parent_threads",
        "The main thread waits in NCCL (ncclCommInitRank, libnccl.so.2) on a condition, called from train.py:12 "
        "in <module>.",
        _native_wait,
        "Start the workers with the spawn start method (multiprocessing.set_start_method('spawn')) ..., or keep "
        "the parent to one thread before it forks: OMP_NUM_THREADS=1 ...",
    ),
    Rule(
        "sleeping",
        "the main thread's wait channel (hrtimer_nanosleep), or its beat sample ending in time.sleep",
        "The main thread is sleeping (time.sleep) at job.py:3 in <module>: a wait the program chose ...",
        _sleeping,
    ),
    Rule(
        "cannot tell",
        "(always last) the innermost Python frame",
        "Cannot tell why; the innermost Python frame is job.py:3 in <module>.",
        _cannot_tell,
    ),
)
"""The causes, most specific first: `explain` returns the first rule's answer. A new cause is one
function and one entry here (and a row in docs/stalls.md, which tests/test_diagnose_rules.py
checks against this list)."""


def with_baseline(
    found: Diagnosis, stall: Stall, journal: Optional[Journal], baseline: Any, now_ns: Optional[int] = None
) -> Diagnosis:
    """``found`` with the drift from the baseline (`lora_otel.analysis.baseline`) that bears on the
    stalled stage put first in the sentence and in ``lora_otel.baseline.drift`` (the rest in
    ``lora_otel.baseline.other_drift``).

    ``baseline``: a `Baseline`, None (no baseline configured: ``found`` as it is) or the
    `BaselineError` that loading it raised (``lora_otel.baseline.error``). Never raises.
    """
    if baseline is None or journal is None:
        return found
    from lora_otel.analysis import baseline as bl

    attrs = dict(found.attrs)
    if isinstance(baseline, BaseException):
        attrs["lora_otel.baseline.error"] = str(baseline)
        return Diagnosis(found.sentence, attrs, found.ages, found.advice)
    attrs["lora_otel.baseline.path"] = baseline.path
    try:
        relevant, other = bl.stall_drift(baseline, stall.span, journal, now_ns)
    except Exception as e:  # noqa: BLE001 - the diagnosis goes on without the baseline
        attrs["lora_otel.baseline.error"] = "cannot compare with %s: %s: %s" % (baseline.path, type(e).__name__, e)
        return Diagnosis(found.sentence, attrs, found.ages, found.advice)
    attrs["lora_otel.baseline.drift"] = [d.text for d in relevant]
    if other:
        attrs["lora_otel.baseline.other_drift"] = [d.text for d in other[:20]]
    prefix = bl.sentence_prefix(relevant)
    return Diagnosis(prefix + found.sentence, attrs, ages.shifted(found.ages, len(prefix)), found.advice)


def stacks_text(evidence: Mapping[str, Any]) -> str:
    """The Python stacks in ``evidence``: faulthandler's dump, then py-spy's — once: stacks that
    py-spy read are ``python.stacks`` already (its dump in faulthandler's form), and the same threads
    twice would be read as twice the threads."""
    if evidence.get(PREFIX + "python.stacks.from") == FROM_OUTSIDE:
        return str(evidence.get(PREFIX + "python.stacks") or "")
    return "\n".join(str(evidence.get(PREFIX + key) or "") for key in ("python.stacks", "py_spy.dump"))


# --- collectives --------------------------------------------------------------------------------


def collective_in(stacks: str) -> Optional[Collective]:
    """The collective a thread of this faulthandler or py-spy dump waits in, or None.

    A thread waits in one when, from its innermost frame outwards, only torch's frames (and native
    ones) come before a torch.distributed collective: ``all_reduce``, ``barrier``, ``broadcast``,
    ``wait`` ... in ``torch/distributed/``, DistributedDataParallel's broadcasts, or a process
    group's native frame (ProcessGroupGloo/NCCL, gloo::, nccl). The op named is the outermost such
    frame before the program's own code, where the call came from. The main thread is looked at
    first.
    """
    threads = _threads(stacks)
    threads.sort(key=lambda t: not t[0].startswith("Current thread") and '"MainThread"' not in t[0])
    for _, frames in threads:
        found = _collective_of(frames)
        if found is not None:
            return found
    return None


def _in(path: str, module: str) -> bool:
    """``path`` is in ``module`` (``torch/distributed/``), wherever it is installed."""
    return path.startswith(module) or ("/" + module) in path


def _is_torch(frame: Frame) -> bool:
    return not frame.python or _in(frame.file.replace("\\", "/"), "torch/")


def _op_of(frame: Frame) -> Optional[str]:
    path = frame.file.replace("\\", "/")
    if frame.python:
        if _in(path, "torch/distributed/") and not any(_in(path, m) for m in _NOT_COLLECTIVE) and _OP.match(frame.func):
            return frame.func.lstrip("_")
        if _in(path, "torch/nn/parallel/distributed.py") and _DDP_OP.search(frame.func):
            return "DistributedDataParallel.%s" % frame.func
        return None
    if _NATIVE.search(frame.func) or _NATIVE.search(path):
        low = frame.func.lower()
        for marker, op in _NATIVE_OPS:
            if marker in low:
                return op
        return "a %s collective" % ("NCCL" if "nccl" in (low + path.lower()) else "process group")
    return None


def _collective_of(frames: list[Frame]) -> Optional[Collective]:
    for i, frame in enumerate(frames):
        op = _op_of(frame)
        if op is None:
            if frame.python and not _is_torch(frame):
                return None  # the thread runs the program's own code, not inside torch
            continue
        called_at = ""
        for outer in frames[i + 1 :]:
            if not _is_torch(outer):
                called_at = _short(outer)
                break
            if outer.python:
                op = _op_of(outer) or op
        return Collective(op, called_at)
    return None


_FAULTHANDLER = re.compile(r'^\s*File "(.*)", line (\d+|\?\?\?) in (.*)$')
_PY_SPY = re.compile(r"^\s+(.+?) \(([^()]*?)(?::(\d+))?\)\s*$")


def _threads(stacks: str) -> list[tuple[str, list[Frame]]]:
    """Each thread's header and frames, innermost first, from faulthandler's or py-spy's dump;
    lora_otel's own threads (the beat) left out."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in stacks.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            threads.append((line, []))
        elif not threads:
            continue
        elif m := _FAULTHANDLER.match(line):
            threads[-1][1].append(Frame(m.group(1), m.group(2), m.group(3).strip(), True))
        elif m := _PY_SPY.match(line):
            func, file, line_no = m.groups()
            threads[-1][1].append(Frame(file, line_no or "", func, file.endswith(".py")))
    out = []
    for head, frames in threads:
        ours = 0
        while ours < len(frames) and _OURS in frames[ours].file.replace("\\", "/"):
            ours += 1
        if ours and all(_in(fr.file.replace("\\", "/"), "threading.py") for fr in frames[ours:]):
            continue  # the beat, or another thread of ours
        if frames[ours:]:
            out.append((head, frames[ours:]))  # a hook of ours around a blocking call: its caller is where it is
    return out


_OURS = "lora_otel/_boot/"


def _short(frame: Frame) -> str:
    return "%s:%s in %s" % (frame.file.replace("\\", "/").rsplit("/", 1)[-1], frame.line, frame.func)


def _rank(journal: Journal, key: str = "rank") -> Optional[int]:
    value = journal.root.attrs.get(key) if journal.root is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def world_peers(journal: Optional[Journal], peers: Iterable[Journal]) -> dict[int, Journal]:
    """The other ranks of ``journal``'s world among ``peers``, by rank.

    A peer counts when its root span has a ``rank`` other than this one's and the same
    ``world_size`` (where both have one). Of several journals with one rank, a process started
    by another of them (a DataLoader worker inherits its rank's variables) is left out, and of
    the rest (a restarted group) the latest started is taken.
    """
    if journal is None or _rank(journal) is None:
        return {}
    me, world = _rank(journal), _rank(journal, "world_size")
    by_rank: dict[int, list[Journal]] = {}
    for peer in peers:
        if peer is journal or peer.path == journal.path or peer.root is None:
            continue
        rank, size = _rank(peer), _rank(peer, "world_size")
        if rank is None or rank == me or (world is not None and (rank >= world or size not in (None, world))):
            continue
        by_rank.setdefault(rank, []).append(peer)
    out = {}
    for rank, found in by_rank.items():
        pids = {j.pid for j in found}
        top = [j for j in found if j.root is not None and j.root.attrs.get("process.parent_pid") not in pids] or found
        out[rank] = max(top, key=lambda j: j.root.start_ns if j.root is not None else 0)  # every root is set (above)
    return out


def _stage(journal: Journal) -> str:
    span = deepest_open_span(journal)
    seen: set[str] = set()  # a corrupt journal's parents may form a cycle
    while span is not None and span.name.startswith("step ") and span.parent_id and span.span_id not in seen:
        seen.add(span.span_id)
        span = journal.span(span.parent_id)  # sampled step spans are part of training
    return span.name if span is not None else ""


def _steps(n: int) -> str:
    return "%d optimizer step%s" % (n, "" if n == 1 else "s")


def _ended(peer: Journal, state: str) -> str:
    if state == "exec'd":
        return exec_phrase(peer)
    if state == "exited":
        exit_ = peer.exit or {}
        code, message = exit_.get("code"), exit_.get("message")
        how = message or ("exit code %s" % code if code is not None else str(exit_.get("how") or "exited"))
        if message and code is not None and "exit code" not in message:
            how += ", exit code %s" % code
        ts = exit_.get("ts")
        return "exited (%s)%s" % (how, " at %s" % iso_time(ts) if isinstance(ts, int) else "")
    last = peer.last_life_ns
    return "vanished without an exit record (killed by a signal: SIGKILL, SIGTERM, ...; or os._exit)%s" % (
        ", last heard of at %s" % iso_time(last) if last else ""
    )


def _peer_facts(
    journal: Journal, me: int, peer: Journal, stacks: str, collective: Collective, now_ns: int, frozen_after_s: float
) -> tuple[str, list[str]]:
    """``("missing" | "arrived" | "unknown", clauses)`` for one peer rank."""
    state = process_state(peer)
    if state != "running":
        return "missing", [_ended(peer, state)]
    clauses = []
    last = peer.last_life_ns or 0
    if last and (now_ns - last) / 1e9 >= frozen_after_s:
        clauses.append("is frozen (no beat for %s)" % ages.growing(now_ns - last))
    if peer.steps != journal.steps:
        clauses.append("has made %s (rank %d: %d)" % (_steps(peer.steps), me, journal.steps))
    stage, mine = _stage(peer), _stage(journal)
    if stage != mine:
        clauses.append(
            "is in %s (rank %d: %s)"
            % ("'%s'" % stage if stage else "no stage", me, "'%s'" % mine if mine else "no stage")
        )
    theirs = collective_in(stacks) if stacks else None
    if stacks and theirs is None:
        where = _innermost_frame(stacks)
        clauses.append("is not in a collective%s" % (" (at %s)" % where if where else ""))
    elif theirs is not None and theirs.op != collective.op:
        clauses.append(
            "waits in another collective (%s%s)" % (theirs.op, " at %s" % theirs.called_at if theirs.called_at else "")
        )
    elif theirs is not None and clauses:
        clauses.append("waits in %s%s" % (theirs.op, " at %s" % theirs.called_at if theirs.called_at else ""))
    if clauses:
        return "missing", clauses
    return ("arrived" if theirs is not None else "unknown"), []


def _ranks(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 1 and 3``, ``ranks 1-3 and 7``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = ["%d-%d" % (run[0], run[-1]) if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    text = ", ".join(parts)
    if len(ranks) == 1:
        return "rank " + text
    head, _, last = text.rpartition(", ")
    return "ranks %s and %s" % (head, last) if head else "ranks " + text


def _collective(
    collective: Collective,
    journal: Optional[Journal],
    peers: list[Journal],
    peer_stacks: Mapping[str, str],
    now_ns: int,
    frozen_after_s: float,
) -> Diagnosis:
    head = "Waiting inside a collective (%s%s)" % (
        collective.op,
        ", called at %s" % collective.called_at if collective.called_at else "",
    )
    attrs: dict[str, Any] = {"lora_otel.collective.op": collective.op}
    if collective.called_at:
        attrs["lora_otel.collective.called_at"] = collective.called_at
    me = _rank(journal) if journal is not None else None
    if journal is None or me is None:
        return Diagnosis("%s; cannot tell which rank never arrived: this process has no rank." % head, attrs)
    attrs["lora_otel.collective.rank"] = me
    world = _rank(journal, "world_size")
    others = world_peers(journal, peers)
    missing: dict[int, list[str]] = {}
    arrived, unknown = [], []
    for rank, peer in sorted(others.items()):
        verdict, clauses = _peer_facts(
            journal, me, peer, peer_stacks.get(peer.path, ""), collective, now_ns, frozen_after_s
        )
        if verdict == "missing":
            missing[rank] = clauses
        elif verdict == "arrived":
            arrived.append(rank)
        else:
            unknown.append(rank)
    # (listed up to the size the job view lists missing ranks for: a journal may claim any world size)
    unseen = sorted(set(range(world)) - set(others) - {me}) if world is not None and world <= 4096 else []
    if missing:
        attrs["lora_otel.collective.missing_ranks"] = sorted(missing)
        told = ["rank %d %s" % (rank, ", ".join(clauses)) for rank, clauses in sorted(missing.items())[:MAX_NAMED]]
        if len(missing) > MAX_NAMED:
            told.append("and %d more" % (len(missing) - MAX_NAMED))
        return Diagnosis(
            "%s; %s never arrived: %s." % (head, _ranks(sorted(missing)), "; ".join(told)),
            attrs,
            advice=_collective_advice(collective, journal, {rank: others[rank] for rank in missing}),
        )
    if not others:
        why = "no other rank of the world%s is followed here" % (" of %d" % world if world else "")
    else:
        parts = []
        if unknown:
            parts.append(
                "%s %s at the same step and stage as rank %d, with no stack to tell"
                % (_ranks(unknown), "is" if len(unknown) == 1 else "are", me)
            )
        if arrived:
            parts.append("%s %s in it too" % (_ranks(arrived), "is" if len(arrived) == 1 else "are"))
        if unseen:
            parts.append("%s %s not followed here" % (_ranks(unseen), "is" if len(unseen) == 1 else "are"))
        why = "; ".join(parts)
    return Diagnosis("%s; cannot tell which rank never arrived: %s." % (head, why), attrs)


def _rank_who(rank: int, peer: Journal) -> str:
    """``rank 1 (pid 4712 on node-2)``: a rank by its journal's pid and host."""
    host = peer.root.attrs.get("host.name") if peer.root is not None else None
    where = ", ".join(
        x
        for x in ("pid %s" % peer.pid if peer.pid else "", "on %s" % host if isinstance(host, str) and host else "")
        if x
    )
    return "rank %d%s" % (rank, " (%s)" % where.replace(", on", " on") if where else "")


def _store(journal: Optional[Journal]) -> str:
    """``10.0.0.1:29500``: the rendezvous store's address, from the job's recorded MASTER_ADDR and
    MASTER_PORT; "" when either is not recorded."""
    addr, port = _env(journal, "MASTER_ADDR"), _env(journal, "MASTER_PORT")
    return "%s:%s" % (addr, port) if addr and port else ""


def _collective_advice(collective: Collective, journal: Optional[Journal], missing: Mapping[int, Journal]) -> str:
    """What to do about ranks that never reached a collective: which ranks to look at (pid, host,
    its journal), since every rank must make the same collective calls in the same order."""
    if not missing:
        return ""
    shown = sorted(missing.items())[:MAX_NAMED]
    store = _store(journal)
    return (
        "Find out why %s did not reach %s: `lora-otel inspect %s` shows where it is; every rank must make the same "
        "collective calls in the same order%s."
        % (
            " and ".join(_rank_who(rank, peer) for rank, peer in shown),
            collective.op,
            shown[0][1].path,
            " (the ranks meet at %s, MASTER_ADDR:MASTER_PORT)" % store if store else "",
        )
    )


def _innermost_frame(stacks: str) -> str:
    """``file:line in func`` of the innermost frame of the program's thread in a faulthandler dump.

    The main thread (the one whose outermost frame is ``<module>``) when the dump shows it; else the
    first thread whose innermost frame is not lora_otel's own (the beat).
    """
    main = next((frames for _, frames in _threads(stacks) if frames and frames[-1].func == "<module>"), None)
    if main:
        return _short(main[0])
    threads: list[list[str]] = []
    for line in stacks.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            threads.append([])
        elif threads and line.strip().startswith("File "):
            threads[-1].append(line.strip())
    for frames in threads:
        ours = 0
        while ours < len(frames) and _OURS in frames[ours]:
            ours += 1
        if frames[ours:] and not (ours and all("threading.py" in fr for fr in frames[ours:])):
            return _short_frame(frames[ours])
    return ""


def _short_frame(frame: str) -> str:
    # File "/x/y.py", line 3 in func  ->  y.py:3 in func
    try:
        path = frame.split('"')[1]
        rest = frame.split('"', 2)[2].strip(", ")
        line_no, _, func = rest.partition(" in ")
        return "%s:%s in %s" % (path.rsplit("/", 1)[-1], line_no.replace("line", "").strip(), func)
    except IndexError:
        return frame


# --- memory pressure, DataLoader workers, locks, a quiet connection -------------------------------

MAJOR_FAULTS_PER_S = 50.0
SWAP_IN_PER_S = 50.0
PRESSURE_AVG10 = 10.0
"""Above any of these (per second; the kernel's ``some avg10`` %), the process counts as slowed by memory."""
AT_LIMIT = 0.95
"""A memory cgroup this full of its limit, with the process's own major faults, is reclaiming it."""


_RECLAIM_WCHAN = (
    "reclaim_throttle",
    "throttle_direct_reclaim",
    "shrink_",
    "try_to_free",
    "mem_cgroup_",
    "balance_pgdat",
)
"""Kernel wait channels of memory reclaim (direct reclaim, a memory cgroup at its limit)."""


def _mb(n: float) -> str:
    return "%.0f MB" % (n / 1e6)


def memory_pressure(evidence: Mapping[str, Any]) -> Optional[str]:
    """``Loading is slowed by swapping: …`` (or by memory reclaim, without swap-ins) when the process
    takes major faults, the machine swaps in, or the kernel reports memory pressure; else None."""
    faults = evidence.get(PREFIX + "memory.major_faults_per_s")
    swap = evidence.get(PREFIX + "memory.swap_in_pages_per_s")
    pressure = max(
        (
            v
            for k, v in evidence.items()
            if k.startswith(PREFIX + "memory.") and k.endswith("_some_avg10") and isinstance(v, (int, float))
        ),
        default=None,
    )
    # The kernel's pressure figure may be the whole machine's: it names this process only while the
    # process itself takes major faults (another job thrashing is not this one's stall).
    own_faults = isinstance(faults, (int, float)) and faults >= MAJOR_FAULTS_PER_S / 10
    # The kernel's own word: a process that waits in reclaim is slowed by memory, whatever one
    # sample's fault rate says.
    wchan = str(evidence.get(PREFIX + "process.wait_channel") or "")
    reclaiming = wchan.startswith(_RECLAIM_WCHAN)
    # A memory cgroup at its limit while the process takes major faults: its pages are evicted and
    # read back (one 0.5 s sample of a thrashing load read 32 faults/s, the cgroup at 99.5 %).
    limit, usage = evidence.get(PREFIX + "memory.limit_bytes"), evidence.get(PREFIX + "memory.cgroup_usage_bytes")
    at_limit = isinstance(limit, int) and isinstance(usage, int) and limit > 0 and usage >= AT_LIMIT * limit
    heavy = (
        reclaiming
        or (at_limit and own_faults)
        or (isinstance(faults, (int, float)) and faults >= MAJOR_FAULTS_PER_S)
        or (isinstance(swap, (int, float)) and swap >= SWAP_IN_PER_S)
        or (pressure is not None and pressure >= PRESSURE_AVG10 and own_faults)
    )
    if not heavy:
        return None
    facts = []
    rss = evidence.get(PREFIX + "process.rss_bytes")
    if isinstance(rss, int) and isinstance(limit, int):
        facts.append(
            "RSS %s%s against a memory limit of %s"
            % (_mb(rss), " (its cgroup %s)" % _mb(usage) if isinstance(usage, int) else "", _mb(limit))
        )
    elif isinstance(rss, int):
        facts.append("RSS %s" % _mb(rss))
    if isinstance(faults, (int, float)):
        facts.append("%.0f major page faults/s" % faults)
    if isinstance(swap, (int, float)) and swap:
        facts.append("%.0f pages swapped in/s" % swap)
    if pressure is not None:
        facts.append("memory pressure %.0f %% (some avg10)" % pressure)
    if reclaiming:
        facts.append("waiting in the kernel's reclaim (wait channel %s)" % wchan)
    swapping = isinstance(swap, (int, float)) and swap >= SWAP_IN_PER_S
    return "Loading is slowed by %s: %s." % (
        "swapping" if swapping else "memory reclaim (pages evicted and read back from disk)",
        ", ".join(facts),
    )


_IDLE_WORKER_WCHAN = ("poll", "select", "pipe_read", "futex", "ep_poll", "unix_stream", "wait_woken")


def dataloader_wait(
    stacks: str, evidence: Mapping[str, Any], stall: Stall, journals: Optional[Mapping[int, Journal]] = None
) -> Optional[str]:
    """The main thread waits for a DataLoader batch: which worker (pid) has not delivered and where
    it is (its journal's main-thread frames or stage, else its kernel wait channel, and which native
    library it waits in: `native.worker_native`, with its journal among ``journals`` by pid); None
    otherwise."""
    main = _main_thread(stacks)
    if main is None or not any(_in(f.file.replace("\\", "/"), "torch/utils/data/") for f in main[:12]):
        return None
    called = next(
        (
            _short(f)
            for f in main
            if f.python
            and not _in(f.file.replace("\\", "/"), "torch/")
            and "/multiprocessing/" not in f.file
            and "/queue" not in f.file
            and "/threading" not in f.file
            and "/selectors" not in f.file
        ),
        "",
    )
    if _fetches_in_process(main):
        # num_workers=0: the batch is made right here; what blocks is the dataset or the collate function.
        return "The DataLoader makes its batch in the main process (no workers) and is stuck in it%s for %s." % (
            " at %s" % called if called else "",
            ages.growing(stall.open_for_s * 1e9),
        )
    head = "The main thread waits for a DataLoader batch%s" % (" (at %s)" % called if called else "")
    kids = [k for k in evidence.get(PREFIX + "process.children") or () if isinstance(k, dict)]
    workers = [
        k
        for k in kids
        if "multiprocessing" in str(k.get("cmdline", "")) or "journal" in k or str(k.get("cmdline", "")) == ""
    ] or kids
    if PREFIX + "process.children" not in evidence:
        return "%s for %s; its workers were not looked at." % (head, ages.growing(stall.open_for_s * 1e9))
    if not workers:
        return "%s; no worker process is left (they may have died)." % head
    stuck = [
        k
        for k in workers
        if k.get("where")
        or _in_work(k)
        or k.get("state") in ("R", "D")
        or not str(k.get("wchan", "")).startswith(_IDLE_WORKER_WCHAN)
    ]
    busy = [
        k
        for k in stuck
        if _in_work(k) or not str(k.get("wchan", "")).startswith(_IDLE_WORKER_WCHAN) or k.get("state") in ("R", "D")
    ]
    shown = busy or stuck
    if not shown:
        return "%s; its %d worker%s all wait for work (%s)." % (
            head,
            len(workers),
            "" if len(workers) == 1 else "s",
            ", ".join("pid %s" % k["pid"] for k in workers),
        )

    def describe(k: dict[str, Any]) -> str:
        where = k.get("where") or ""
        how = {"R": "running", "D": "in disk I/O", "S": "sleeping", "T": "stopped"}.get(
            str(k.get("state")), str(k.get("state"))
        )
        text = "worker pid %s is %s%s, %s %% CPU" % (
            k["pid"],
            how,
            " in %s" % k["wchan"] if k.get("wchan") not in (None, "-") else "",
            k.get("cpu_percent", "?"),
        )
        frames = k.get("frames")
        if not where and isinstance(frames, list) and frames:
            from lora_otel.journal.reader import where_text

            inner = [[_package_path(str(f[0])), *f[1:]] for f in frames[-4:] if isinstance(f, list) and len(f) == 3]
            text += "; its main thread is at %s (read from outside)" % where_text(inner)
        else:
            text += "; its journal: %s" % where if where else ""
        found = native.worker_native(k, (journals or {}).get(k.get("pid")), dataloader=True)  # type: ignore[arg-type]
        return text + ("; %s" % found.phrase if found is not None else "")

    return "%s for %s; %s." % (
        head,
        ages.growing(stall.open_for_s * 1e9),
        "; ".join(describe(k) for k in shown[:MAX_NAMED]),
    )


def _in_work(worker: Mapping[str, Any]) -> bool:
    """A worker whose main thread, read from outside (``frames``), is in the dataset or the collate
    function — not in the worker loop's wait for its next index (``_utils/worker.py`` at the queue's
    ``get``): blocked in the program's own code whatever its wait channel (an event, a lock, a pipe
    look idle)."""
    frames = [f for f in worker.get("frames") or () if isinstance(f, list) and len(f) == 3]
    if not frames:
        return False
    inner = str(frames[-1][0]).replace("\\", "/")
    return not any(m in inner for m in ("multiprocessing/", "/queue.py", "_utils/worker.py", "/threading.py")) or any(
        "_utils/fetch.py" in str(f[0]) for f in frames
    )


def _package_path(file: str) -> str:
    """``/venv/lib/python3.11/site-packages/torch/utils/data/x.py`` → ``torch/utils/data/x.py``;
    ``/usr/lib/python3.11/queue.py`` → ``queue.py``; a program's file → its name (the beat's way)."""
    file = file.replace("\\", "/")
    for mark in ("/site-packages/", "/dist-packages/"):
        if mark in file:
            return file.rsplit(mark, 1)[1]
    found = re.search(r"/lib/python3\.\d+/(.*)$", file)
    return found.group(1) if found else file.rsplit("/", 1)[-1]


def _fetches_in_process(main: list[Frame]) -> bool:
    """Whether the main thread is inside a DataLoader's in-process fetch (``_utils/fetch.py``: a
    ``num_workers=0`` loader calling the dataset and the collate function itself), not waiting on
    workers."""
    for frame in main:  # innermost first: the first DataLoader frame met tells
        file = frame.file.replace("\\", "/")
        if _in(file, "torch/utils/data/_utils/fetch.py"):
            return True
        if _in(file, "torch/utils/data/dataloader.py") or "multiprocessing/" in file or "/queue" in file:
            return False
    return False


def _main_thread(stacks: str) -> Optional[list[Frame]]:
    """The main thread's frames, innermost first: the thread whose outermost frame is ``<module>``."""
    threads = _threads(stacks)
    main = _named_main(threads)
    return main if main is not None else (threads[-1][1] if threads else None)


def _named_main(threads: list[tuple[str, list[Frame]]]) -> Optional[list[Frame]]:
    """The thread whose outermost frame is ``<module>``; else (at exit, in an atexit handler, no
    frame is) the dump's current thread or py-spy's ``MainThread``; None when none is told."""
    for _, frames in threads:
        if frames and frames[-1].func == "<module>":
            return frames
    for head, frames in threads:
        if frames and (head.startswith("Current thread") or '"MainThread"' in head):
            return frames
    return None


_WITH = re.compile(r"^\s*(?:async\s+)?with\s+(.+?)\s*:\s*(?:#.*)?$")
_ACQUIRE = re.compile(r"([\w.\[\]]+)\.acquire\(")


def _source(frame: Frame) -> str:
    import linecache

    path = _source_file(frame.file) if frame.line.isdigit() else None
    return linecache.getline(path, int(frame.line)) if path else ""


def _source_file(name: str) -> Optional[str]:
    """The file a frame's source is read from, only when it is a regular file (a journal or stacks
    file may name anything; ``open`` on a FIFO would wait forever): ``name`` itself, or for a bare
    name (the beat's samples keep ``threading.py``, ``job.py``) the first regular file of that name
    on ``sys.path``, where `linecache` would look."""
    import os
    import stat
    import sys

    candidates = [name] if os.path.isabs(name) else [os.path.join(d or ".", name) for d in ["", *sys.path]]
    for path in candidates:
        try:
            if stat.S_ISREG(os.stat(path).st_mode):
                return path
        except (OSError, ValueError):
            continue
    return None


def _waits_for(frame: Frame) -> Optional[str]:
    """The lock a thread's innermost Python frame is acquiring (``with lock_b:``, ``lock_b.acquire()``)."""
    text = _source(frame)
    m = _ACQUIRE.search(text)
    if m:
        return m.group(1)
    m = _WITH.match(text)
    if m:
        return m.group(1).split(" as ")[0].strip()
    return None


def _holds(frames: list[Frame]) -> list[str]:
    """The ``with X:`` blocks the thread's frames are inside (as far as the source shows), innermost last."""
    import ast

    held: list[str] = []
    for frame in reversed(frames):
        if not frame.python or not frame.line.isdigit():
            continue
        from lora_otel._boot.seam import files

        try:
            with open(files.open_regular(frame.file), encoding="utf-8") as f:  # never a FIFO's open
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            continue
        line = int(frame.line)
        for node in ast.walk(tree):
            if (
                isinstance(node, (ast.With, ast.AsyncWith))
                and node.body
                and node.body[0].lineno <= line <= (node.end_lineno or line)
            ):
                held += [ast.unparse(item.context_expr) for item in node.items]
    return held


def _thread_name(frames: list[Frame]) -> str:
    if frames and frames[-1].func == "<module>":
        return "the main thread"
    outer = [f for f in frames if f.python and "threading.py" not in f.file]
    return "thread %s()" % outer[-1].func if outer else "a thread"


_IDLE_HELPERS = (
    "tqdm/_monitor.py",
    "concurrent/futures/thread.py",
    "concurrent/futures/process.py",
    "multiprocessing/pool.py",
    "multiprocessing/queues.py",
    "multiprocessing/resource_sharer.py",
    "torch/utils/data/_utils/pin_memory.py",
    "huggingface_hub/",
    "datasets/",
    "transformers/",
    "queue.py",
    "socketserver.py",
    "sched.py",
)
"""Modules whose background threads idle in a timed wait (tqdm's monitor, an executor's idle
worker, a pool's handler threads, torch's pin-memory thread, the hubs' upload and telemetry
threads): a thread of theirs waiting on a condition is not what a job is stuck on."""


def _idle_helper(frames: list[Frame]) -> bool:
    """A thread other than the main one that waits on a condition or event (``threading.py``'s
    ``wait``) inside one of `_IDLE_HELPERS`, or in nothing but the threading module itself."""
    if _thread_name(frames) == "the main thread" or not (
        frames[0].func == "wait" and _in(frames[0].file, "threading.py")
    ):
        return False
    outer = [fr.file.replace("\\", "/") for fr in frames if fr.python and not _in(fr.file, "threading.py")]
    return not outer or any(_in(file, module) for file in outer for module in _IDLE_HELPERS)


def _event_wait(frames: list[Frame]) -> str:
    """``Waiting for an event: the main thread waits in Event.wait() at hangs.py:63 in flush for
    another thread to set or notify it; …``: the main thread in ``threading``'s Condition.wait, named
    by what called it (an Event, a Queue, a Barrier, a Thread's join, a bare Condition)."""
    inner = [fr for fr in frames if fr.python and _in(fr.file, "threading.py")]
    outer = next((fr for fr in frames if fr.python and not _in(fr.file, "threading.py")), None)
    if outer is not None and _in(outer.file, "queue.py"):
        what = "Queue.%s()" % outer.func
        mine = (fr for fr in frames if fr.python and not _in(fr.file, "threading.py") and not _in(fr.file, "queue.py"))
        outer = next(mine, outer)
    elif len(inner) > 1 and inner[1].func == "wait":
        what = "Event.wait()"
    elif len(inner) > 1:
        what = "%s() (threading)" % inner[1].func
    else:
        what = "Condition.wait()"
    where = " at %s" % _short(outer) if outer is not None else ""
    return (
        "Waiting for an event: the main thread waits in %s%s for another thread to set or notify it;"
        " no thread the stacks show is doing so." % (what, where)
    )


def lock_waits(stacks: str) -> Optional[str]:
    """Threads waiting to acquire ``threading`` locks (as the source lines of their innermost frames
    show), which lock each waits for and which it holds; a cycle is called a deadlock. None when no
    thread waits on a lock."""
    waits, event = _lock_wait_rows(stacks)
    if not waits:
        return event
    holder = {h: name for name, _, _, held in waits for h in held}
    cycle = [w for w in waits if w[1] in holder and holder[w[1]] != w[0]]
    parts = []
    for name, lock, where, held in waits:
        text = "%s waits in %s.acquire at %s" % (name, lock, where)
        if held:
            text += " holding %s" % " and ".join(held)
        if lock in holder and holder[lock] != name:
            text += " (%s is held by %s)" % (lock, holder[lock])
        parts.append(text)
    if len(cycle) >= 2:
        return "Deadlock: %s." % "; ".join(parts)
    return (
        "Waiting for a lock: %s; no other thread the stacks show holds it." % "; ".join(parts)
        if not any(w[1] in holder for w in waits)
        else "Waiting for a lock: %s." % "; ".join(parts)
    )


def deadlock_advice(stacks: str) -> str:
    """For a deadlock whose every thread's wait and held locks the source shows (`lock_waits`):
    take the locks in one order everywhere, naming where each thread takes them; "" otherwise
    (no cycle, or a lock held where the source does not show it)."""
    waits, _ = _lock_wait_rows(stacks)
    holder = {h: name for name, _, _, held in waits for h in held}
    cycle = [w for w in waits if w[1] in holder and holder[w[1]] != w[0] and w[3]]
    if len(cycle) < 2:
        return ""
    locks = list(dict.fromkeys(lock for _, lock, _, _ in cycle))
    told = "; ".join(
        "%s takes %s at %s while holding %s" % (name, lock, where, " and ".join(held))
        for name, lock, where, held in cycle
    )
    return "Take %s in one order in every thread (%s), or hold one lock for both." % (" and ".join(locks), told)


def _lock_wait_rows(stacks: str) -> tuple[list[tuple[str, str, str, list[str]]], Optional[str]]:
    """The threads waiting on a ``threading`` lock (`lock_waits`), the main thread first: (who,
    the lock, where, the locks it holds as its source's ``with`` blocks show); and the main thread's
    wait for an event (`_event_wait`) when it waits on one, else None."""
    waits = []
    threads = _threads(stacks)
    main = _named_main(threads)
    event: Optional[str] = None
    for _, frames in threads:
        if not frames or not frames[0].python:
            continue
        lock = _waits_for(frames[0])
        if lock is None:
            continue
        if frames[0].func == "wait" and _in(frames[0].file, "threading.py"):
            # Condition.wait (an Event's, a Queue's, a Barrier's): it released its lock to wait
            if frames is main:
                event = _event_wait(frames)
            continue
        if frames is not main and _idle_helper(frames):
            continue
        held = [h for h in _holds(frames) if h != lock]
        waits.append(("the main thread" if frames is main else _thread_name(frames), lock, _short(frames[0]), held))
    waits.sort(key=lambda w: w[0] != "the main thread")
    return waits, event


def network_quiet(evidence: Mapping[str, Any], stall: Stall) -> Optional[str]:
    """``Waiting on the network: nothing read from 10.0.0.5:443 in the 1 s sampled …`` when the
    process read (almost) nothing meanwhile and holds an established TCP connection; else None."""
    rate = evidence.get(PREFIX + "io.read_bytes_per_s")
    sampled = evidence.get(PREFIX + "io.sampled_s")
    conns = [c for c in evidence.get(PREFIX + "net.tcp_connections") or () if str(c).endswith("ESTABLISHED")]
    if not conns or not isinstance(rate, (int, float)) or rate > QUIET_BYTES_PER_S:
        return None
    remotes = [str(c).split(" -> ", 1)[1].rsplit(" ", 1)[0] for c in conns if " -> " in str(c)]
    remote = ", ".join(sorted(set(remotes))[:3])
    return (
        "Waiting on the network: %s has gone quiet (the process read %s/s in all over the %s sampled) and "
        "it has waited on it for %s."
        % (
            remote,
            _bytes(rate),
            format_duration(round((sampled or 0) * 1e9)),
            ages.growing(stall.open_for_s * 1e9),
        )
    )


def accept_wait(stacks: str, evidence: Mapping[str, Any]) -> Optional[str]:
    """``Waiting for a connection on 127.0.0.1:8000 (accept, at job.py:4 in <module>); no client has
    connected.`` when the process is blocked in ``accept()`` (its main thread's wait channel, or an
    ``accept`` innermost on its stack) and has listening TCP sockets; else None."""
    conns = evidence.get(PREFIX + "net.tcp_connections") or ()
    listening = [str(c).split(" -> ", 1)[0] for c in conns if str(c).endswith(" LISTEN")]
    main = _main_thread(stacks) or []
    in_accept = str(evidence.get(PREFIX + "process.wait_channel") or "").startswith("inet_csk_accept") or any(
        fr.func in ("accept", "_accept") for fr in main[:3]
    )
    if not listening or not in_accept:
        return None
    where = next((_short(fr) for fr in main if fr.python and not fr.file.replace("\\", "/").endswith("/socket.py")), "")
    return "Waiting for a connection on %s (accept%s); no client has connected." % (
        ", ".join(sorted(set(listening))[:3]),
        ", at %s" % where if where else "",
    )


QUIET_BYTES_PER_S = 64 * 1024
"""A process reading less than this (all its reads: /proc/<pid>/io ``rchar``) has no download moving."""


def _bytes(n: float) -> str:
    return "%.0f B" % n if n < 1000 else "%.1f kB" % (n / 1000)
