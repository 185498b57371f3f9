"""Issue 37 item 1: the beat's stack dump adds a frame's simple locals and ``self``'s simple
attributes (what a poll loop polls), without running any code of the program's."""

from __future__ import annotations

import pathlib
import sys
import threading

from lora_otel._boot import preamble

PIDFILE = "/run/train.pid"
UNUSED_GLOBAL = "/not/named/by/the/code"


class Loud(str):
    def __repr__(self) -> str:  # a subclass's repr is the program's code: never called
        raise AssertionError("the program's __repr__ ran")


class Watched:
    def __init__(self) -> None:
        self.lock_file_path = "/c/ext/lock"
        self.wait_seconds = 0.5
        self.path = pathlib.PurePosixPath("/data/x.done")
        self.api_token = "hf_abcdefghijklmnopqrstuvwxyz012345"
        self.child = object()
        self.name = Loud("loud")

    def __getattribute__(self, name: str) -> object:
        if name != "__dict__":
            raise AssertionError("the program's __getattribute__ ran for %s" % name)
        return object.__getattribute__(self, name)

    def frame(self) -> list[str]:
        port = 8765
        flag = True
        data = b"/tmp/raw"
        long = "x" * 5000
        password = "s3cret-value-here"
        frame = sys._getframe()
        _ = PIDFILE
        _ = (port, flag, data, long, password)
        return preamble._simple_locals(frame)


def test_simple_locals_and_self_attributes_only_and_no_program_code() -> None:
    lines = Watched.frame(Watched())
    text = "".join(lines)
    assert "    local self.lock_file_path = '/c/ext/lock'\n" in lines
    assert "    local self.wait_seconds = 0.5\n" in lines
    assert "    local self.path = '/data/x.done'\n" in lines
    assert "    local port = 8765\n" in lines and "    local flag = True\n" in lines
    assert "    local data = '/tmp/raw'\n" in lines
    assert "    local PIDFILE = '/run/train.pid'\n" in lines  # a global the code names
    assert "UNUSED_GLOBAL" not in text
    assert "hf_abc" not in text and "s3cret" not in text  # secret-named: left out
    assert "self.child" not in text and "self.name" not in text  # not a simple type (a str subclass is not)
    assert max(len(line) for line in lines) < preamble.LOCAL_CHARS + 40
    assert len(lines) <= preamble.LOCALS_MAX


def test_the_dump_carries_the_locals_of_a_sleeping_thread() -> None:
    ready, done = threading.Event(), threading.Event()

    def poll(lock_path: str) -> None:
        ready.set()
        while not done.wait(0.05):
            pass

    thread = threading.Thread(target=poll, args=("/c/ext/lock",), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        dump = preamble._stack_dump()
    finally:
        done.set()
        thread.join(10)
    assert "    local lock_path = '/c/ext/lock'\n" in dump
