"""randomness.token_bytes: the CSPRNG read a chunk at a time, never a byte handed out twice."""

from __future__ import annotations

import os
import threading

from leadsvc import randomness


def test_draws_are_sliced_from_one_read_of_the_system_csprng_until_it_is_used_up(monkeypatch):
    reads = []

    def urandom(count: int) -> bytes:
        reads.append(count)
        return bytes(i % 251 for i in range(len(reads) * 1000, len(reads) * 1000 + count))

    monkeypatch.setattr(randomness.os, "urandom", urandom)
    monkeypatch.setattr(randomness, "_state", threading.local())
    draws = [randomness.token_bytes(16) for _ in range(randomness.CHUNK // 16)]
    assert reads == [randomness.CHUNK]
    assert b"".join(draws) == bytes(i % 251 for i in range(1000, 1000 + randomness.CHUNK)), "in order, once each"
    assert randomness.token_bytes(16) and reads == [randomness.CHUNK, randomness.CHUNK]
    assert len(randomness.token_bytes(randomness.CHUNK + 1)) == randomness.CHUNK + 1   # more than a chunk


def test_threads_draw_different_bytes():
    drawn: list[bytes] = []

    def draw() -> None:
        drawn.extend(randomness.token_bytes(16) for _ in range(300))   # past one chunk

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(drawn) == 1200 and len(set(drawn)) == 1200


def test_a_forked_child_never_repeats_its_parents_bytes():
    randomness.token_bytes(16)   # this thread holds a chunk with bytes not handed out yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report its next draw and leave at once
        os.write(write, randomness.token_bytes(16))
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 16 and child != randomness.token_bytes(16)
