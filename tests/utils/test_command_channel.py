"""The shared-memory command ring: commands in order, room while a worker lags, marks and error slots; from one
process, and with a worker process reading behind a posting rank 0."""

import multiprocessing as mp
import random
from multiprocessing.shared_memory import SharedMemory

import pytest

from nanovllm.utils.command_channel import RING_SLOTS, CommandChannel


@pytest.fixture
def channel():
    channel = CommandChannel(num_workers=2, capacity=1 << 12, context=mp.get_context("spawn"))
    yield channel
    channel.close(unlink=True)


def post(channel: CommandChannel, data: bytes) -> None:
    assert channel.wait_for_room(len(data), timeout=0)
    channel.post(data)


def test_every_worker_reads_each_command_once_in_order(channel):
    post(channel, b"first")
    post(channel, b"second")
    assert [channel.receive(0), channel.receive(0)] == [b"first", b"second"]
    assert channel.receive(1) == b"first"
    assert not channel.ready[0].acquire(timeout=0.01)  # nothing more was posted
    assert (channel.consumed(0), channel.consumed(1)) == (2, 1)


def test_a_full_ring_waits_for_the_slowest_worker(channel):
    for i in range(RING_SLOTS):
        post(channel, bytes([i]))
    assert not channel.wait_for_room(1, timeout=0.01)
    assert channel.receive(0) == bytes([0])
    assert not channel.wait_for_room(1, timeout=0.01)  # worker 1 still holds the oldest slot
    assert channel.receive(1) == bytes([0])
    post(channel, b"next")
    assert [channel.receive(1) for _ in range(RING_SLOTS)] == [bytes([i]) for i in range(1, RING_SLOTS)] + [b"next"]


def test_a_command_waits_for_the_bytes_it_needs(channel):
    post(channel, b"a" * 3000)
    assert not channel.wait_for_room(2000, timeout=0.01)  # the ring holds 4096 bytes
    post(channel, b"b" * 1000)
    channel.receive(0), channel.receive(1)
    assert not channel.wait_for_room(3500, timeout=0.01)  # the second command still holds its bytes
    assert channel.wait_for_room(3000, timeout=0)  # wrapped around to the start, before the second
    channel.receive(0), channel.receive(1)
    post(channel, b"c" * 4096)  # a drained ring takes the largest command
    assert channel.receive(1) == b"c" * 4096


def test_marks_are_counted_per_worker(channel):
    assert not channel.wait_done(0, 1, timeout=0.01)
    channel.mark_done(0)
    channel.mark_done(0)
    assert channel.wait_done(0, 2, timeout=0.01)
    assert not channel.wait_done(0, 3, timeout=0.01)
    assert not channel.wait_done(1, 1, timeout=0.01)


def test_error_slots_are_separate_and_truncated(channel):
    assert channel.read_error(0) == channel.read_error(1) == ""
    channel.write_error(1, "ValueError: boom")
    assert (channel.read_error(0), channel.read_error(1)) == ("", "ValueError: boom")
    channel.write_error(0, "x" * 10_000)
    assert channel.read_error(0) == "x" * (4096 - 8)


def test_a_command_larger_than_the_channel_is_refused(channel):
    with pytest.raises(RuntimeError, match="a command of 5000 bytes, more than the 4096-byte channel"):
        channel.wait_for_room(5000, timeout=0)


def test_unlink_removes_the_segment():
    channel = CommandChannel(1, 1024, mp.get_context("spawn"))
    name = channel.name
    channel.close(unlink=True)
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=name)


def commands(count: int) -> list[bytes]:
    """Commands of random sizes, some near the ring's 4096 bytes, so that they wrap around it."""
    rng = random.Random(0)
    return [bytes([i % 256]) * rng.choice([1, 50, 700, 2500, 4096]) for i in range(count)]


def read_slowly(channel: CommandChannel, count: int, results) -> None:
    """A worker that takes a moment over each command, and reports what it read."""
    import time

    received = []
    for _ in range(count):
        received.append(channel.receive(0))
        time.sleep(0.002)
        channel.mark_done(0)
    results.put(received)
    channel.close()


def test_a_worker_process_reads_every_command_in_order_behind_rank_0():
    context = mp.get_context("spawn")
    channel = CommandChannel(1, 1 << 12, context)
    sent = commands(6 * RING_SLOTS)
    results = context.Queue()
    worker = context.Process(target=read_slowly, args=(channel, len(sent), results), daemon=True)
    worker.start()
    try:
        ahead = 0
        for data in sent:
            assert channel.wait_for_room(len(data), timeout=30)
            channel.post(data)
            ahead = max(ahead, channel.posted - channel.consumed(0))
        assert 1 <= ahead <= RING_SLOTS
        assert channel.wait_done(0, len(sent), timeout=30)
        assert results.get(timeout=30) == sent
        worker.join(10)
        assert worker.exitcode == 0
    finally:
        worker.kill()
        channel.close(unlink=True)
