"""How lora_otel opens the files it writes, and keeps the descriptors it holds its own.

Two rules (DESIGN.md principle 6), for every file the training process, ``lora-otel run`` or the
sidecar writes — the journal, the ``--log`` copy, the stacks file, the sidecar's log, the children
registry:

- **No path another user could have prepared.** A file is created new (``O_CREAT | O_EXCL |
  O_NOFOLLOW``, mode 0600; the program's log file 0666 minus the umask, :func:`open_program_log`);
  one that already exists is opened with ``O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`` (a FIFO planted
  there, by another user through ``/tmp`` too, would otherwise block the open until someone reads
  it: the program, hung at ``import torch``) and kept only when ``fstat`` on the opened descriptor
  says it is a regular file owned by this user, with one name, and not group- or world-writable
  (:func:`open_append`). ``O_NONBLOCK`` stays set: on a regular file it changes nothing. A
  directory lora_otel falls back to is created 0700 and kept only when it is this user's, not a
  symlink, with no access for others (:func:`private_dir`); the per-user state directory is
  created 0700 component by component and used only while nobody else can steer it
  (:func:`state_dir_reason`).
- **No descriptor number the program may reuse.** A descriptor is moved to a high number, below
  the soft ``RLIMIT_NOFILE`` (never changed), where programs that allocate the lowest free number do
  not reach (:func:`move_high`), and its identity (device, inode) is compared with the one recorded
  at open before each write (:func:`same`): after ``os.closerange(3, 1024)`` the number may name the
  program's own file, which lora_otel then never writes to.

Standard library only; ``fcntl`` is imported on the first :func:`move_high` that may meet another
thread (~0.2 ms, once).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Sequence

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
APPEND = os.O_WRONLY | os.O_APPEND | O_CLOEXEC | O_NOFOLLOW
EXISTING = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
"""Added to every open of a path that may already exist: a FIFO never blocks the open (no reader:
``ENXIO``; a reader: `check_own` refuses it), a terminal never becomes the controlling one."""
ENXIO = 6
HIGH_FLOOR_MAX = 4096
"""The highest descriptor floor used: a table of 4096 entries costs the kernel 32 KiB per process
(and ``fork`` copies it), where the soft limit may be a million."""


class UnsafeFile(OSError):  # noqa: N818 - named for the condition, as OSError subclasses are (FileExistsError)
    """An existing path lora_otel will not write to: not a regular file, someone else's, or
    writable by others. ``str()`` is one English clause naming why."""


def check_own(fd: int, path: str, group_ok: bool = False, one_name: bool = False) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of ``fd`` when it is a regular file owned by this user and not group-
    (unless ``group_ok``) or world-writable, and (``one_name``) not a hard link of a file named
    elsewhere too; else :class:`UnsafeFile`."""
    import stat

    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile("%s is not a regular file" % path)
    if one_name and st.st_nlink != 1:
        raise UnsafeFile("%s has %d names (a hard link)" % (path, st.st_nlink))
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise UnsafeFile("%s belongs to uid %d, not to this user (uid %d)" % (path, st.st_uid, os.geteuid()))
    if st.st_mode & (0o002 if group_ok else 0o022):
        raise UnsafeFile("%s is writable by other users (mode %o)" % (path, st.st_mode & 0o777))
    return st.st_dev, st.st_ino


def create_new(path: str, flags: int = APPEND) -> int:
    """A new file at ``path``, mode 0600: ``FileExistsError`` when anything (a symlink included) is there."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o600)


def open_existing(path: str, flags: int = APPEND) -> int:
    """``path`` opened without following a symlink and without blocking (`EXISTING`), kept only when
    :func:`check_own` accepts it: a regular file of this user's with no other name. lora_otel's own
    files (journal, stacks, sidecar log, children registry) never have another: one that does was
    linked there by someone else (to a file of this user's they wanted written)."""
    return _open_checked(path, flags, group_ok=False, one_name=True)


def _open_checked(path: str, flags: int, group_ok: bool, one_name: bool) -> int:
    """``path`` opened with ``flags``, never through a symlink nor blocking, then kept only when
    :func:`check_own` accepts it; a symlink, a FIFO nobody reads or a socket is :class:`UnsafeFile`."""
    try:
        fd = os.open(path, flags | O_NOFOLLOW | EXISTING)
    except OSError as e:
        if e.errno == 40:  # ELOOP: O_NOFOLLOW met a symlink
            raise UnsafeFile("%s is a symlink" % path) from None
        if e.errno == ENXIO:  # a FIFO nobody reads, or a socket
            raise UnsafeFile("%s is not a regular file (a FIFO or a socket)" % path) from None
        raise
    try:
        check_own(fd, path, group_ok=group_ok, one_name=one_name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str, flags: int = os.O_RDONLY) -> int:
    """``path`` opened without blocking (`EXISTING`), kept only when ``fstat`` on the descriptor
    says it is a regular file (else :class:`UnsafeFile`): for reading a file whose name came from a
    journal, a registry or a directory listing, where a FIFO or a device may have been put since
    (``open()`` on a FIFO waits for a writer forever). Add ``O_NOFOLLOW`` to ``flags`` where a
    symlink must not be followed. Close-on-exec."""
    import stat

    fd = os.open(path, flags | O_CLOEXEC | EXISTING)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile("%s is not a regular file" % path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_head(path: str, size: int) -> bytes:
    """The first ``size`` bytes of the regular file at ``path`` (symlinks followed: a package's
    metadata, a program's log), opened without blocking: a FIFO or a device planted there is never
    waited on nor read (:class:`UnsafeFile`, `open_regular`)."""
    fd = open_regular(path)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def open_append(path: str, create: bool = True) -> int:
    """For appending: ``path`` created new, or the existing file when it is safely this user's.

    Raises ``OSError`` (:class:`UnsafeFile` for a symlink or someone else's file,
    ``ENOENT`` when absent and not ``create``).
    """
    if create:
        try:
            return create_new(path)
        except FileExistsError:
            pass
    return open_existing(path)


def open_program_log(path: str, create: bool = True) -> tuple[int, bool]:
    """``(fd, created)`` for appending lora_otel's lines to the program's own log file: created new
    (``O_EXCL|O_NOFOLLOW``) with the mode the program would give it, 0666 minus the umask; or the
    existing file, not through a symlink, when it is a regular file of this user's that only this
    user and its group can write (``umask 002`` makes a program's log group-writable). Raises
    ``OSError`` as :func:`open_append` does. ``create`` False: the existing file only (a child
    writing into its job's log never makes one where the job's was moved away)."""
    if create:
        try:
            return os.open(path, APPEND | os.O_CREAT | os.O_EXCL, 0o666), True
        except FileExistsError:
            pass
    return _open_checked(path, APPEND, group_ok=True, one_name=False), False


def unique_name(path: str, suffix: str = "") -> str:
    """``run.log.stacks.txt`` → ``run.log.stacks.<random>.txt``: a name nobody could predict."""
    token = os.urandom(4).hex()
    if suffix and path.endswith(suffix):
        return "%s.%s%s" % (path[: -len(suffix)], token, suffix)
    base, dot, ext = path.rpartition(".")
    if dot and "/" not in ext:
        return "%s.%s.%s" % (base, token, ext)
    return "%s.%s" % (path, token)


def open_sibling(path: str) -> tuple[int, str]:
    """``(fd, path used)`` for a file beside the journal (stacks, sidecar log, children registry):
    ``path`` created new or reused when safely this user's; otherwise a unique variant, created new.
    Raises ``OSError`` when neither can be created."""
    fd, used, _ = create_sibling(path)
    return fd, used


def create_sibling(path: str) -> tuple[int, str, bool]:
    """`open_sibling`, also saying whether this call created the file (True) or reused one that was
    there (False): a short run removes at its exit only the files it created."""
    try:
        return create_new(path), path, True
    except FileExistsError:
        pass
    try:
        return open_existing(path), path, False
    except FileNotFoundError:
        raise
    except OSError:
        pass
    for _ in range(8):
        other = unique_name(path)
        try:
            return create_new(other), other, True
        except FileExistsError:
            continue
    raise UnsafeFile("%s and 8 unique variants are taken" % path)


def private_dir(path: str) -> str:
    """``path`` as a directory only this user can use: created 0700, or kept when it already is one
    (not a symlink, this user's, no access for group or others). Otherwise a new unique directory
    ``<path>-<random>`` (0700). Returns the directory used; raises ``OSError`` when none can be made."""
    import stat

    try:
        os.mkdir(path, 0o700)
        return path
    except FileExistsError:
        pass
    st = os.lstat(path)
    if (
        stat.S_ISDIR(st.st_mode)
        and not (st.st_mode & 0o077)
        and (not hasattr(os, "geteuid") or st.st_uid == os.geteuid())
    ):
        return path
    for _ in range(8):
        other = "%s-%s" % (path, os.urandom(4).hex())
        try:
            os.mkdir(other, 0o700)
            return other
        except FileExistsError:
            continue
    raise UnsafeFile("%s is unsafe and 8 unique variants are taken" % path)


def unsafe_dir_reason(path: str) -> str:
    """Why ``path`` is not a private directory of this user's ("" when it is)."""
    import stat

    try:
        st = os.lstat(path)
    except OSError as e:
        return "%s: %s" % (path, e.strerror or e)
    if stat.S_ISLNK(st.st_mode):
        return "%s is a symlink" % path
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a directory" % path
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return "%s belongs to uid %d" % (path, st.st_uid)
    if st.st_mode & 0o077:
        return "%s has mode %o" % (path, st.st_mode & 0o777)
    return ""


def steered_dir_reason(path: str, default: bool) -> str:
    """Why another local user could decide what happens in the journal directory ``path`` ("" when
    nobody can): a symlink (the last component) that someone else made; a directory writable by
    everyone without the sticky bit; and, with ``default`` (a component of the state directory that
    lora_otel creates: not a place the user chose), a directory or link that is not this user's.
    Root's are trusted, as the system's."""
    import stat

    try:
        lst = os.lstat(path)
    except OSError:
        return ""  # absent: created 0700 by this process
    me = os.geteuid() if hasattr(os, "geteuid") else None
    if me is None:
        return ""
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (me, 0):
        return "%s is a symlink made by uid %d" % (path, lst.st_uid)
    try:
        st = os.stat(path)
    except OSError:
        return ""
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        return "%s is writable by every user (mode %o, no sticky bit)" % (path, st.st_mode & 0o7777)
    if default and (lst.st_uid not in (me, 0) or st.st_uid not in (me, 0)):
        return "%s belongs to uid %d" % (path, st.st_uid if lst.st_uid in (me, 0) else lst.st_uid)
    return ""


def state_dir_reason(base: str, parts: Sequence[str], make_base: bool) -> str:
    """Why the per-user state directory ``base/parts...`` is not safe for journals ("" when it is),
    creating on the way each missing component of ``parts`` (0700; ``base`` itself only with
    ``make_base``, ``$XDG_STATE_HOME``: a home is never created).

    ``base`` is a place the user chose (their home): only what would let anyone steer it counts
    (`steered_dir_reason`); each component below it must also be this user's or root's, as the
    default ``./lora-otel`` had to be (a shared or borrowed home: ``sudo`` keeping ``$HOME``, a
    ``HOME=/tmp``). Raises ``OSError`` when a component cannot be created (a read-only home).
    """
    reason = steered_dir_reason(base, default=False)
    if reason:
        return reason
    if make_base and not os.path.isdir(base):
        os.makedirs(base, mode=0o700, exist_ok=True)
    path = base
    for part in parts:
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
            continue
        except FileExistsError:
            pass
        reason = steered_dir_reason(path, default=True)
        if reason:
            return reason
    return ""


_floor = 0


def move_high(fd: int, alone: bool = False) -> int:
    """``fd`` duplicated (close-on-exec) to the lowest free number at or above a high floor
    (``min(soft RLIMIT_NOFILE, 4096) - 64``), the original closed; ``fd`` itself when that fails.

    ``alone``: no other thread can open a descriptor meanwhile (the preamble at interpreter start,
    a forked child's hook): then a free number is found with ``fstat`` and taken with ``dup2``, and
    ``fcntl`` is not loaded (~0.2 ms, which a process that ends at once need not pay)."""
    global _floor
    try:
        if not _floor:
            limit = os.sysconf("SC_OPEN_MAX")  # the soft RLIMIT_NOFILE
            _floor = max(min(limit, HIGH_FLOOR_MAX) - 64, 3)
        if fd >= _floor:
            return fd
        high = _dup_free(fd) if alone else -1
        if high < 0:
            from lora_otel._boot.stdlib import module

            fcntl = module("fcntl")  # (never a fcntl.py of the working directory)
            high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _floor)
    except (OSError, ValueError, AttributeError, ImportError):
        return fd
    try:
        os.close(fd)
    except OSError:
        pass
    return high


def _dup_free(fd: int) -> int:
    """``fd`` duplicated (close-on-exec) onto the first of a few numbers from the floor that is not
    open; -1 when none is free. Only where no other thread can take that number between the look
    and the ``dup2`` (which would close it)."""
    for target in range(_floor, _floor + 8):
        try:
            os.fstat(target)
        except OSError as e:
            if e.errno == 9:  # EBADF: not open
                return os.dup2(fd, target, inheritable=False)
    return -1


def identity(fd: int) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of an open descriptor (``OSError`` when it is closed)."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def same(fd: int, ident: tuple[int, int]) -> bool:
    """Whether ``fd`` still names the file recorded as ``ident`` (one ``fstat``, ~0.5 µs)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return st.st_ino == ident[1] and st.st_dev == ident[0]
