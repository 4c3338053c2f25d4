"""Random bytes for public ids and request ids: the system's CSPRNG, read 4 KB at a time.

`secrets` makes a system call for every draw, and CPython lets go of the GIL around it: a
create drew eight times (five public ids, of which `randbelow` redraws two in five, and the
request id), and under load each release could hand the GIL to another thread and take a
context switch to get it back. Here each thread reads 4,096 bytes from `os.urandom` and hands
them out in order; a forked child starts over, so it never repeats its parent's bytes. Tokens'
secrets do not come from here (auth uses `secrets` directly): they are credentials, and a
buffer of bytes not yet used has no business outliving the call that made them.
"""

from __future__ import annotations

import os
import threading

CHUNK = 4096

_state = threading.local()


def token_bytes(count: int) -> bytes:
    """`count` bytes from the operating system's CSPRNG, no byte ever handed out twice."""
    data, at = getattr(_state, "data", b""), getattr(_state, "at", 0)
    if at + count > len(data):
        data, at = os.urandom(max(CHUNK, count)), 0
        _state.data = data
    _state.at = at + count
    return data[at:at + count]


def _start_over() -> None:
    global _state
    _state = threading.local()


os.register_at_fork(after_in_child=_start_over)
