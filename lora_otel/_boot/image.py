"""What identifies the program image a process runs (`image_identity`), for telling later whether it
exec'd: recorded by the preamble at start, compared by the reading side (`lora_otel._boot.seam`).

A module of its own, importing only `os`: the sidecar of every job compares
it, and must not load the preamble for it (docs/performance.md, "Memory a traced job adds").
"""

from __future__ import annotations

import os


def _digest(data: bytes) -> int:
    """A short fingerprint of some bytes (not cryptographic; no import: ``hashlib`` costs at start)."""
    return int.from_bytes(b"\x01" + data, "big") % 2305843009213693951  # 2**61 - 1


def image_identity(pid: int | str = "self") -> dict[str, object]:
    """What identifies the program image a process runs, for telling later whether it exec'd.

    ``exe``: ``[st_dev, st_ino]`` of ``/proc/<pid>/exe``; ``auxv``: a fingerprint of
    ``/proc/<pid>/auxv``, which the kernel sets at exec and never changes after (its addresses are
    randomised per exec); ``cmdline``: a fingerprint of ``/proc/<pid>/cmdline`` (set at exec, but a
    program may rewrite it: ``setproctitle``). A fact that cannot be read is left out.
    """
    out: dict[str, object] = {}
    try:
        st = os.stat("/proc/%s/exe" % pid)
        out["exe"] = [st.st_dev, st.st_ino]
    except OSError:
        pass
    for name in ("auxv", "cmdline"):
        try:
            fd = os.open("/proc/%s/%s" % (pid, name), os.O_RDONLY)
            try:
                data = b""
                while True:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    data += chunk
            finally:
                os.close(fd)
        except OSError:
            continue
        if data:
            out[name] = _digest(data)
    return out
