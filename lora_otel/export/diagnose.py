"""One sentence of diagnosis for a stall, drawn only from the evidence — or an honest "cannot tell".

The rules look at the Python stacks (faulthandler or py-spy), the process state and wait channel,
and the stall's kind, most specific first. Each rule names what it saw, so the sentence can be
checked against the evidence attached beside it.
"""

from __future__ import annotations

from typing import Any

from lora_otel.export.evidence import PREFIX
from lora_otel.export.stall import Stall

_NET_MARKERS = ("socket.py", "ssl.py", "http/client.py", "urllib3/", "requests/", "httpx/", "selectors.py")
# Kernel wait channels of a task blocked on a socket.
_NET_WCHAN = ("sk_wait", "tcp_", "inet_", "sock_", "unix_stream", "udp_")
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all", "send", "recv")


def diagnose(stall: Stall, evidence: dict[str, Any]) -> str:
    stacks = (evidence.get(PREFIX + "python.stacks") or "") + (evidence.get(PREFIX + "py_spy.dump") or "")
    state = str(evidence.get(PREFIX + "process.state") or "")
    wchan = str(evidence.get(PREFIX + "process.wait_channel") or "")
    innermost = _innermost_frame(stacks)
    if state.startswith("T"):
        return "The process is stopped (SIGSTOP or a debugger), not running at all."
    if state.startswith("D"):
        return "The process is in uninterruptible disk I/O (kernel wait channel %s)." % (wchan or "unknown")
    conns = [c for c in evidence.get(PREFIX + "net.tcp_connections") or () if c.endswith("ESTABLISHED")]
    # Blocked (not on CPU) with an open TCP connection, or a socket call on the stack.
    on_network = any(m in stacks for m in _NET_MARKERS) or wchan.startswith(_NET_WCHAN) or (
        bool(conns) and state.startswith("S") and wchan in ("wait_woken", "sk_wait_data", "do_poll", "do_select",
                                                            "do_sys_poll", "ep_poll", "__skb_wait_for_more_packets"))
    if "huggingface_hub" in stacks and on_network:
        return "Waiting on the network inside huggingface_hub (a hub download or API call)%s." % (
            "; connection %s" % conns[0] if conns else "")
    if "torch/distributed" in stacks and any(c in stacks for c in _COLLECTIVES):
        return "Waiting inside a torch.distributed collective: another rank has not arrived."
    if "torch/cuda/__init__.py" in stacks and "_lazy_init" in stacks:
        return "Inside CUDA driver initialisation (torch.cuda._lazy_init)."
    if on_network:
        return "Waiting on the network (%s)." % (innermost or "a socket call")
    if stall.kind == "frozen":
        cpu = evidence.get(PREFIX + "process.cpu_percent")
        if isinstance(cpu, (int, float)) and cpu > 50:
            return "Holding the GIL in native code and busy on the CPU (%.0f %%)%s." % (
                cpu, "; last Python frame: %s" % innermost if innermost else "")
        return "Holding the GIL in native code while blocked (wait channel %s)%s." % (
            wchan or "unknown", "; last Python frame: %s" % innermost if innermost else "")
    if innermost:
        return "Cannot tell why; the innermost Python frame is %s." % innermost
    return "Cannot tell from the evidence."


def _innermost_frame(stacks: str) -> str:
    """``file:line in func`` of the innermost frame of the program's thread in a faulthandler dump.

    Threads whose innermost frame is lora_otel's own (the beat) are skipped.
    """
    threads: list = []
    for line in stacks.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            threads.append([])
        elif threads and line.strip().startswith("File "):
            threads[-1].append(line.strip())
    for frames in threads:
        if frames and "lora_otel/_boot/" not in frames[0]:
            return _short_frame(frames[0])
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
