"""The shared-memory command channel, exercised from one process."""

import multiprocessing as mp
from multiprocessing.shared_memory import SharedMemory

import pytest

from nanovllm.utils.command_channel import CommandChannel


@pytest.fixture
def channel():
    channel = CommandChannel(num_workers=2, capacity=1 << 12, context=mp.get_context("spawn"))
    yield channel
    channel.close(unlink=True)


def test_every_worker_reads_the_command_once(channel):
    channel.send("run", [1, 2, 3], {"x": 4})
    assert channel.receive(0) == ("run", ([1, 2, 3], {"x": 4}))
    assert channel.receive(1) == ("run", ([1, 2, 3], {"x": 4}))
    assert not channel.ready[0].acquire(timeout=0.01)  # nothing more was posted


def test_done_is_reported_per_worker(channel):
    assert not channel.wait_done(0, timeout=0.01)
    channel.mark_done(0)
    assert channel.wait_done(0, timeout=0.01)
    assert not channel.wait_done(0, timeout=0.01)
    assert not channel.wait_done(1, timeout=0.01)


def test_error_slots_are_separate_and_truncated(channel):
    assert channel.read_error(0) == channel.read_error(1) == ""
    channel.write_error(1, "ValueError: boom")
    assert (channel.read_error(0), channel.read_error(1)) == ("", "ValueError: boom")
    channel.write_error(0, "x" * 10_000)
    assert channel.read_error(0) == "x" * (4096 - 8)


def test_a_command_larger_than_the_channel_is_refused(channel):
    with pytest.raises(RuntimeError, match="more than the 4096-byte channel"):
        channel.send("run", list(range(5000)))


def test_unlink_removes_the_segment():
    channel = CommandChannel(1, 1024, mp.get_context("spawn"))
    name = channel.name
    channel.close(unlink=True)
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=name)
