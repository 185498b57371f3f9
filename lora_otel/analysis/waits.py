"""What a blocked thread waits on, told from the facts `waitfacts` gathers: a read, write or open on a
descriptor or path — the job's standard input, a pipe, a FIFO, a terminal, a socket, a file on a
network or FUSE mount — and what is at its other end, followed along the chain of waits from
process to process (the launcher holding the pipe's write end that waits for its child, the local
server at a socket's other end that itself waits on a pipe), to the process at the chain's end.

Pure: a function of recorded evidence (``lora_otel.evidence.wait.*``), no ``/proc``.
`descriptor_wait` answers with the sentence, the next step the evidence supports ("" when none),
and the pid at the end of the chain; None when the main thread's wait is not one this reads, or
when another rule tells it better (a socket with no local peer: the network; a wait for a child
whose wait is not read: the worker pool).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Optional

KEY = "lora_otel.evidence.wait."
NETWORK_FS = (
    "nfs",
    "cifs",
    "smb",
    "fuse",
    "9p",
    "ceph",
    "glusterfs",
    "lustre",
    "afs",
    "gpfs",
    "beegfs",
    "sshfs",
    "davfs",
    "s3fs",
    "orangefs",
    "virtiofs",
)
"""File system types (prefixes: ``nfs4``, ``fuse.sshfs``) served by another host or a user-space
program: a read or an open there waits for that server to answer, forever on a ``hard`` NFS mount."""
FIFO_OPEN_WCHAN = ("wait_for_partner", "fifo_open")
"""Kernel wait channels of an ``open`` of a FIFO waiting for its other side to be opened."""
_STD = {0: "its standard input", 1: "its standard output", 2: "its standard error"}
_VERB = {"read": "waits to read", "write": "waits to write to", "open": "waits to open", "poll": "waits for"}
_ROLE = {
    "writer": "its write end",
    "reader": "its read end",
    "peer": "the other end",
    "holder": "it",
    "server": "the file system is served by the only program holding /dev/fuse open,",
}
MAX_HOPS = 4

# What a process that is in none of the waits above waits in, by its kernel wait channel.
_WCHAN_WORDS = (
    ("do_wait", "waits for a child process to exit"),
    ("kernel_wait4", "waits for a child process to exit"),
    ("hrtimer_nanosleep", "sleeps"),
    ("do_nanosleep", "sleeps"),
    ("futex", "waits on a lock or condition (futex)"),
    ("ep_poll", "polls descriptors (epoll)"),
    ("do_select", "polls descriptors (select)"),
    ("do_sys_poll", "polls descriptors (poll)"),
    ("do_poll", "polls descriptors (poll)"),
    ("__do_sys_pause", "waits for a signal (pause)"),
    ("inet_csk_accept", "waits for a connection (accept)"),
    ("unix_stream", "waits on a Unix socket"),
    ("sk_wait", "waits on a socket"),
    ("anon_pipe_read", "waits in a pipe read"),
    ("pipe_read", "waits in a pipe read"),
    ("anon_pipe_write", "waits in a pipe write"),
    ("pipe_write", "waits in a pipe write"),
    ("wait_woken", "waits for data (a terminal or socket read)"),
)


class Wait(NamedTuple):
    sentence: str
    advice: str
    end_pid: Optional[int]  # the process at the end of the chain, when another than the job


def _waits(evidence: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [w for w in evidence.get(KEY + "threads") or () if isinstance(w, Mapping)]


def main_wait(evidence: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The main thread's wait in ``evidence``, None when it is in none `waitfacts` reads."""
    return next((w for w in _waits(evidence) if w.get("main") is True), None)


def network_mount(wait: Mapping[str, Any]) -> Optional[str]:
    """The mount point of the network or FUSE file system the wait's file or path is on; None otherwise."""
    what = wait.get("what") or {}
    fstype = str(what.get("fstype") or "")
    return str(what.get("mount")) if fstype.startswith(NETWORK_FS) and what.get("mount") else None


def _cmd(text: Any) -> str:
    cmd = str(text or "").strip()
    head, sep, rest = cmd.partition(" ")
    if head.startswith("/"):  # /root/.pyenv/versions/3.11.7/bin/python3 ui.py -> python3 ui.py
        cmd = head.rsplit("/", 1)[-1] + sep + rest
    return cmd if len(cmd) <= 80 else cmd[:79] + "\u2026"


def _who(proc: Mapping[str, Any], job: Optional[int]) -> str:
    if job is not None and proc.get("pid") == job:
        return "this job (pid %s)" % proc.get("pid")
    cmd = _cmd(proc.get("cmdline"))
    return "pid %s%s" % (proc.get("pid"), " (`%s`)" % cmd if cmd else "")


def _polled(wait: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [e for e in wait.get("polled") or () if isinstance(e, Mapping)]


def _object(wait: Mapping[str, Any]) -> str:
    """``its standard input (fd 0, a pipe)``, ``descriptor 5 (the FIFO /tmp/in.fifo)``, ``/mnt/x/a.bin``;
    for a poll, ``descriptor 5 (a pipe) or descriptor 7 (a pipe) to be readable``."""
    if wait.get("op") == "poll":
        entries = _polled(wait)
        ops = {str(e.get("op")) for e in entries}
        told = " or ".join(_object({**e, "polled": None}) for e in entries[:4])
        more = int(wait.get("polled_more") or 0) + max(0, len(entries) - 4)
        return "%s%s to be %s" % (
            told or "descriptors",
            " (and %d more)" % more if more else "",
            "readable" if ops == {"read"} else "writable" if ops == {"write"} else "ready",
        )
    if wait.get("op") == "open":
        path = str(wait.get("path") or "")
        what = wait.get("what") or {}
        if str(wait.get("wchan") or "").startswith(FIFO_OPEN_WCHAN):
            return "the FIFO %s" % (path or "(its path not readable from outside)")
        on = ""
        if network_mount(wait) is not None:
            on = " on the %s mount %s%s" % (
                what.get("fstype"),
                what.get("mount"),
                " (%s)" % what["source"] if what.get("source") and what.get("source") != "none" else "",
            )
        return "%s%s" % (path or "a path (not readable from outside)", on)
    fd = wait.get("fd")
    what = wait.get("what") or {}
    kind = what.get("kind")
    target = str(what.get("target") or "")
    if kind == "pipe":
        desc = "a pipe"
        if wait.get("op") == "write" and isinstance(what.get("queued_bytes"), int):
            desc += " holding %d bytes" % what["queued_bytes"]
    elif kind == "fifo":
        desc = "the FIFO %s" % target
    elif kind == "terminal":
        desc = "the terminal %s" % target
        if what.get("foreground") is False:
            desc += ", from the background: its process group %s is not the terminal's foreground group %s" % (
                what.get("pgrp"),
                what.get("tpgid"),
            )
    elif kind == "socket":
        if what.get("proto") == "tcp":
            desc = "a TCP connection %s → %s" % (what.get("local"), what.get("remote"))
        elif what.get("proto") == "unix":
            desc = "a Unix socket%s" % (" %s" % what["name"] if what.get("name") else "")
        else:
            desc = "a socket"
    elif kind == "file":
        desc = "the file %s" % target
        if what.get("mount"):
            desc += " on the %s mount %s%s" % (
                what.get("fstype"),
                what.get("mount"),
                " (%s)" % what["source"] if what.get("source") and what.get("source") != "none" else "",
            )
    elif kind == "null":
        desc = "/dev/null"
    else:
        desc = target or "unknown"
    name = _STD.get(fd, "descriptor %s" % fd) if isinstance(fd, int) else "a descriptor"
    return "%s (fd %s, %s)" % (name, fd, desc) if isinstance(fd, int) and fd in _STD else "%s (%s)" % (name, desc)


def _wchan_words(wchan: str) -> str:
    doing = next((text for prefix, text in _WCHAN_WORDS if wchan.startswith(prefix)), "waits in the kernel")
    return "%s (wait channel %s)" % (doing, wchan) if wchan and wchan != "-" else doing


def _doing(proc: Mapping[str, Any], job: Optional[int]) -> str:
    """What a process on the chain does, in words (``waits to read descriptor 3 (a pipe)``)."""
    state = str(proc.get("state") or "")
    if proc.get("error"):
        return "cannot be read (%s)" % proc["error"]
    if state == "T":
        return "is stopped (SIGSTOP, a debugger, or a terminal read from the background)"
    if state == "Z":
        return "has ended but not been reaped (a zombie)"
    if state == "R":
        return "is running"
    op = proc.get("op")
    if proc.get("loop") or op is None:
        return _wchan_words(str(proc.get("wchan") or ""))
    if op == "child":
        child = proc.get("child")
        kids = [k for k in proc.get("other") or () if isinstance(k, Mapping) and "pid" in k]
        if len(kids) == 1:
            return "waits for its child %s to exit" % _who(kids[0], job)
        if isinstance(child, int) and child > 0:
            return "waits for its child pid %d to exit" % child
        return "waits for a child process to exit"
    if op == "poll":
        return "waits for %s (%s)" % (_object(proc), proc.get("syscall")) if _polled(proc) else "polls descriptors"
    return "%s %s" % (_VERB.get(str(op), "waits on"), _object(proc))


def _hops(wait: Mapping[str, Any], job: Optional[int]) -> list[Mapping[str, Any]]:
    """The processes along the chain from ``wait``, first of each other end."""
    hops: list[Mapping[str, Any]] = []
    here = wait
    seen = {job}
    while len(hops) < MAX_HOPS:
        others = [o for o in here.get("other") or () if isinstance(o, Mapping) and "pid" in o]
        if not others:
            break
        nxt = others[0]
        hops.append(nxt)
        if nxt.get("loop") or nxt.get("pid") in seen:
            break
        seen.add(nxt.get("pid"))
        here = nxt
    return hops


def _more(here: Mapping[str, Any]) -> str:
    others = [o for o in here.get("other") or () if isinstance(o, Mapping)]
    extra = sum(int(o.get("more") or 0) for o in others) + max(0, len([o for o in others if "pid" in o]) - 1)
    return " (and %d more)" % extra if extra else ""


def _no_other_end(wait: Mapping[str, Any]) -> str:
    """The clause for a wait whose other end was looked for and not found."""
    what = wait.get("what") or {}
    op = wait.get("op")
    if op == "open":
        return "no other process has it open"
    end = "write end" if op == "read" else "read end"
    if what.get("kind") in ("pipe", "fifo"):
        return "no process this user can see holds its %s (another user's, or in another PID namespace)" % end
    if op == "child":
        return "no child of it can be seen"
    return ""


def _noun(wait: Mapping[str, Any]) -> str:
    kind = (wait.get("what") or {}).get("kind")
    return {"pipe": "pipe", "fifo": "FIFO", "socket": "connection"}.get(str(kind), "descriptor")


def _chain(wait: Mapping[str, Any], job: Optional[int]) -> tuple[str, list[Mapping[str, Any]]]:
    """``; its write end is held by pid 4711 (`python ui.py`), which waits for its child this job …``."""
    hops = _hops(wait, job)
    if not hops:
        clause = _no_other_end(wait) if wait.get("other") is not None else ""
        return ("; " + clause if clause else ""), hops
    parts: list[str] = []
    here = wait
    for hop in hops:
        role = str(hop.get("role") or "")
        if hop.get("pid") == here.get("pid") and role in ("writer", "reader") and _only(here):
            parts.append(
                "%s%s is held by %s itself: it cannot see an end of the %s while it holds that end"
                % (
                    _ROLE[role] if here is wait else "the %s of that %s" % (_ROLE[role][4:], _noun(here)),
                    _more(here),
                    "this job" if hop.get("pid") == job else "the same process",
                    _noun(here),
                )
            )
            break
        if hop.get("pid") == job and parts:  # back at the job: the one before waits for it
            parts[-1] += " — each waits for the other"
            break
        who = "%s%s" % (_who(hop, job), _more(here))
        if role == "child":
            parts.append("its child %s %s" % (who, _doing(hop, job)))
        elif role == "server":
            parts.append("%s %s, which %s" % (_ROLE[role], who, _doing(hop, job)))
        elif here is wait and wait.get("op") == "poll":
            parts.append("the other end is held by %s, which %s" % (who, _doing(hop, job)))
        elif here is wait:
            parts.append("%s is held by %s, which %s" % (_ROLE.get(role, "the other end"), who, _doing(hop, job)))
        else:
            end = _ROLE.get(role, "the other end")
            end = "the %s of that %s" % (end[4:], _noun(here))  # its write end -> the write end of that pipe
            parts.append("%s is held by %s, which %s" % (end, who, _doing(hop, job)))
        if hop.get("loop"):
            break
        here = hop
    else:
        last = hops[-1]
        if last.get("other") is not None and not [o for o in last.get("other") or () if isinstance(o, Mapping)]:
            clause = _no_other_end(last)
            if clause:
                parts.append(clause)
    return "; " + "; ".join(parts), hops


def _only(here: Mapping[str, Any]) -> bool:
    """Whether one process (and no other) holds the other end of ``here``'s descriptor."""
    others = [o for o in here.get("other") or () if isinstance(o, Mapping)]
    return len(others) == 1 and "pid" in others[0]


def _self_held(hops: list[Mapping[str, Any]], wait: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The process on the chain that waits to read (write) a pipe whose other end it holds itself."""
    here = wait
    for hop in hops:
        if hop.get("pid") == here.get("pid") and hop.get("role") in ("writer", "reader") and _only(here):
            return here
        here = hop
    return None


_PROMPT = re.compile(r"\b(?:input|getpass|prompt|confirm|ask)\s*\(")


def _prompt(calls: Sequence[str]) -> bool:
    """Whether the main thread's innermost calls show a prompt: the C function the beat saw it in
    (``input``), or its source line calling ``input(``, ``getpass(``, ``click.prompt(``, ``Confirm.ask(``."""
    return any(call in ("input", "getpass") or _PROMPT.search(call) is not None for call in calls)


def _end_of(wait: Mapping[str, Any], hops: list[Mapping[str, Any]], job: Optional[int]) -> Optional[Mapping[str, Any]]:
    """The last process on the chain that is not the job itself."""
    rest = [h for h in hops if h.get("pid") != job]
    return rest[-1] if rest else None


def _advice(wait: Mapping[str, Any], hops: list[Mapping[str, Any]], job: Optional[int], prompt: bool) -> str:
    op, fd = wait.get("op"), wait.get("fd")
    what = wait.get("what") or {}
    kind = what.get("kind")
    end = _end_of(wait, hops, job)
    mount = network_mount(wait)
    loop = any(h.get("pid") == job for h in hops)
    if mount is not None:
        return (
            "Check the %s mount %s from a shell (`ls %s`): if that hangs too, its server%s does not answer — "
            "bring it back or unmount it (`umount -l %s`); the job goes on once the file answers."
            % (
                what.get("fstype"),
                mount,
                mount,
                " (%s)" % what["source"] if what.get("source") and what.get("source") != "none" else "",
                mount,
            )
        )
    held = _self_held(hops, wait)
    if held is not None:
        who = "This job" if held.get("pid") == job else "The process " + _who(held, job)
        return (
            "%s holds the %s end of the %s it waits on itself (a copy kept after a fork or Popen): it must close "
            "its own copy of that end, or the %s never ends."
            % (who, "write" if held.get("op") == "read" else "read", _noun(held), held.get("op") or "wait")
        )
    if op == "read" and fd == 0:
        if kind == "terminal" and what.get("foreground") is False:
            return (
                "It reads its terminal from the background: bring it to the foreground (`fg`), or start "
                "it with its standard input from /dev/null (`< /dev/null`)."
            )
        if kind == "terminal" and prompt:
            return (
                "It waits for an answer typed in its terminal: type it, or pass the program's option that "
                "skips the prompt."
            )
        if prompt:
            holder = ""
            if hops and what.get("queued_bytes") == 0:
                holder = " (%s holds its other end and has written nothing to read)" % _who(hops[0], job)
            return (
                "The program asks for input on its standard input%s: answer it, or pass the program's option "
                "that skips the prompt; started from a UI or a script, its standard input must be /dev/null "
                "(`subprocess.DEVNULL`, `< /dev/null`) so that a prompt fails at once instead of waiting." % holder
            )
        if kind in ("pipe", "fifo") and hops:
            return (
                "It reads its standard input until %s writes to it or closes it: have that process close "
                "its end, or start the job with its standard input from /dev/null." % _who(hops[0], job)
            )
    reader = next(
        (h for h in hops if h.get("op") == "read" and h.get("fd") == 0 and not h.get("loop") and h.get("pid") != job),
        None,
    )
    if reader is not None and (reader.get("what") or {}).get("kind") in ("pipe", "fifo"):
        writer = next((o for o in reader.get("other") or () if isinstance(o, Mapping) and "pid" in o), None)
        return (
            "The %s %s waits to read its standard input%s: give it the input it reads, or start it with its "
            "standard input from /dev/null (`stdin=subprocess.DEVNULL`) so that the read ends at once."
            % (
                "child" if reader.get("role") == "child" else "process",
                _who(reader, job),
                ", which %s holds and does not write to" % _who(writer, job) if writer else "",
            )
        )
    if op == "read" and kind in ("pipe", "fifo") and wait.get("other") == []:
        return ""
    if op == "open" and str(wait.get("wchan") or "").startswith(FIFO_OPEN_WCHAN) and not hops:
        return (
            "Start the program that opens %s from the other side: opening a FIFO waits until both ends are "
            "open (or open it with O_NONBLOCK)." % (wait.get("path") or "the FIFO")
        )
    if kind == "fifo" and op == "read" and not hops:
        return "Start the program that writes to the FIFO %s." % what.get("target")
    if loop and hops and hops[0].get("pid") != job:
        first = hops[0]
        if first.get("op") == "child":
            return (
                "%s waits for this job to exit before it %s the pipe: it must close its end (or pass "
                "`subprocess.DEVNULL`) before waiting, or use `Popen.communicate()`."
                % (_who(first, job), "writes to" if op == "read" else "reads")
            )
    if end is not None and not end.get("loop"):
        return "Look at %s, at the end of the chain: it %s — that, not this job, is what to unblock." % (
            _who(end, job),
            _doing(end, job),
        )
    return ""


def _tells(wait: Mapping[str, Any]) -> bool:
    """Whether this wait is one this reading tells better than the other rules (see the module)."""
    op = wait.get("op")
    what = wait.get("what") or {}
    kind = what.get("kind")
    if network_mount(wait) is not None:
        return True
    if op == "child":
        return _tells_end(wait)
    if op == "poll":
        entries = _polled(wait)
        if not entries or wait.get("polled_more"):
            return False
        for entry in entries:
            kind = (entry.get("what") or {}).get("kind")
            others = [o for o in entry.get("other") or () if isinstance(o, Mapping)]
            if kind not in ("pipe", "fifo", "terminal", "socket") or (kind == "socket" and not others):
                return False  # a remote socket (the network), an eventfd, a timer: not told here
            if any(o.get("pid") == wait.get("pid") for o in others):
                return False  # its own wake-up pipe or socket pair (an event loop)
        return any(entry.get("other") for entry in entries)
    if op == "open":
        return bool(wait.get("path")) and (
            str(wait.get("wchan") or "").startswith(FIFO_OPEN_WCHAN) or wait.get("other") is not None
        )
    if op not in ("read", "write"):
        return False
    if kind in ("pipe", "fifo", "terminal"):
        return True
    if kind == "socket":
        return bool(_hops(wait, None))
    return False


def _tells_end(wait: Mapping[str, Any]) -> bool:
    """For a wait for a child: the chain reaches a process whose own wait this reads."""
    return any(h.get("op") in ("read", "write", "open") and _tells(h) for h in _hops(wait, None) if not h.get("loop"))


def background_read(evidence: Mapping[str, Any]) -> Optional[Wait]:
    """``The process is stopped: its main thread read its terminal … from the background …`` for a
    stopped process whose main thread is in a read of a terminal whose foreground group is not its
    own; None otherwise."""
    wait = main_wait(evidence)
    what = (wait.get("what") or {}) if wait is not None else {}
    if (
        wait is None
        or wait.get("op") != "read"
        or what.get("kind") != "terminal"
        or what.get("foreground") is not False
    ):
        return None
    return Wait(
        "The process is stopped, in a read of %s from the background (its process group %s is not the "
        "terminal's foreground group %s): a terminal stops a process that reads it from the background "
        "(SIGTTIN) until it is brought to the foreground."
        % (
            "its standard input, the terminal %s" % what.get("target")
            if wait.get("fd") == 0
            else "the terminal %s" % what.get("target"),
            what.get("pgrp"),
            what.get("tpgid"),
        ),
        _advice(wait, [], None, False)
        or "Bring it to the foreground (`fg`), or give it input that is not the terminal.",
        None,
    )


def descriptor_wait(
    evidence: Mapping[str, Any], where: str = "", job: Optional[int] = None, calls: Sequence[str] = ()
) -> Optional[Wait]:
    """``The main thread waits to read its standard input (fd 0, a pipe) at job.py:7 in <module> → input;
    its write end is held by pid 4711 (`python ui.py`), which waits for its child this job (pid 4712)
    to exit — each waits for the other.`` with its advice; None when the main thread's wait is not one
    this reads better than the other rules.

    ``where``: the main thread's place (``job.py:7 in <module> → input``); ``job``: the job's pid;
    ``calls``: the main thread's innermost calls and source line, which tell a prompt."""
    wait = main_wait(evidence)
    if wait is None or not _tells(wait):
        return None
    if job is None and isinstance(wait.get("pid"), int):
        job = wait["pid"]
    op = wait.get("op")
    if op == "child":
        head = "The main thread waits for %s" % (
            "a child process to exit" if not _hops(wait, job) else "its child process to exit"
        )
    else:
        head = "The main thread %s %s" % (_VERB.get(str(op), "waits on"), _object(wait))
    if where:
        head += " at %s" % where
    if op == "open" and str(wait.get("wchan") or "").startswith(FIFO_OPEN_WCHAN):
        head += " (a FIFO's open waits until another process opens its other end)"
    if network_mount(wait) is not None:
        seen = ["state D"] if str(wait.get("state") or "").startswith("D") else []
        seen += ["wait channel %s" % wait["wchan"]] if wait.get("wchan") not in (None, "", "-") else []
        head += ", for the file system's server to answer%s" % (" (%s)" % ", ".join(seen) if seen else "")
    chain, hops = _chain(wait, job)
    if op == "child" and hops:
        chain = chain.replace("; its child ", ": ", 1) if chain.startswith("; its child ") else chain
    end = _end_of(wait, hops, job)
    sentence = head + chain + "."
    fd = wait.get("fd")
    advice = _advice(wait, hops, job, op == "read" and fd == 0 and _prompt(calls))
    return Wait(sentence, advice, end.get("pid") if end is not None and isinstance(end.get("pid"), int) else None)
