"""Issue 37 (hostile trial, /proc/<pid>/mem note): reads of a process's memory are bounded in size
and never touch a file mapped from a FUSE or network mount (a read faults the page in, and a server
that does not answer would block the sidecar)."""

from __future__ import annotations

import ctypes
import os

import pytest

from lora_otel.analysis import waitfacts

MAPS = (
    "7f0000000000-7f0000001000 r--p 00000000 00:2f 1234 /mnt/fuse/model.bin\n"
    "7f0000001000-7f0000003000 rw-p 00000000 00:00 0 \n"
    "7f0000003000-7f0000004000 r--p 00000000 08:01 99 /usr/lib/libc.so.6\n"
)
MOUNTINFO = (
    "25 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
    "60 25 0:47 / /mnt/fuse rw,nosuid,nodev - fuse.sshfs host:/x rw,user_id=0\n"
)


@pytest.fixture
def fake_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"/proc/1/maps": MAPS, "/proc/1/mountinfo": MOUNTINFO}
    monkeypatch.setattr(waitfacts, "_read", lambda path: files[path])


@pytest.mark.usefixtures("fake_proc")
def test_a_file_on_a_fuse_mount_is_not_read_other_memory_is() -> None:
    """The FUSE file's mapping (device 00:2f = 0:47 in mountinfo) is refused, a read running into it
    from below too; anonymous memory and a file on a local disk are not."""
    assert waitfacts._on_remote_mapping(1, 0x7F0000000010, 16)
    assert waitfacts._on_remote_mapping(1, 0x7EFFFFFFFFF0, 64)  # (runs into it)
    assert not waitfacts._on_remote_mapping(1, 0x7F0000001000, 4096)
    assert not waitfacts._on_remote_mapping(1, 0x7F0000003000, 64)
    with pytest.raises(OSError, match="FUSE or network"):
        waitfacts._mem_bytes(1, 0x7F0000000010, 16)


def test_a_read_is_capped() -> None:
    """However large the size asked (a pollfd count is the program's), at most MEM_MAX bytes."""
    buf = ctypes.create_string_buffer(b"/x/y.lock", 3 * waitfacts.MEM_MAX)
    address = ctypes.addressof(buf)
    assert len(waitfacts._mem_bytes(os.getpid(), address, 10**9)) == waitfacts.MEM_MAX
    assert waitfacts._mem_string(os.getpid(), address) == "/x/y.lock"
