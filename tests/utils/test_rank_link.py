"""Rank 0's TCP link to the ranks of other nodes: commands out, answers and errors back, a closed
connection seen as a rank gone, and ranks that never connect named."""

import threading
import time

import pytest

from nanovllm.utils.rank_link import RankLink, RankListener


@pytest.fixture
def linked():
    """Rank 0's end (a RemoteRank of rank 1, node 1) and rank 1's end (a RankLink), connected."""
    listener = RankListener("127.0.0.1")
    links = []
    thread = threading.Thread(target=lambda: links.append(RankLink("127.0.0.1", listener.port, 1)))
    thread.start()
    [remote] = listener.accept(range(1, 2), ranks_per_node=1, timeout=10)
    thread.join()
    yield remote, links[0]
    remote.close()
    links[0].close()
    listener.close()


def test_a_command_and_its_answer_cross(linked):
    remote, link = linked
    assert (remote.rank, remote.node) == (1, 1)
    remote.send(b"first")
    remote.send(b"second")  # posted without waiting for the first to run
    assert link.receive() == b"first"
    assert remote.marks == 1  # connecting is its first mark
    assert not remote.wait_done(2, 0.05)  # not answered yet
    link.mark_done()
    assert link.receive() == b"second"
    link.mark_done()
    assert remote.wait_done(3, 5) and remote.alive()


def test_an_error_the_rank_sends_is_its_failure(linked):
    remote, link = linked
    link.write_error("RuntimeError: out of memory")
    assert not remote.alive(5)
    assert remote.describe().startswith("tensor-parallel rank 1 on node 1 (127.0.0.1:")
    assert remote.describe().endswith("failed: RuntimeError: out of memory")


def test_a_closed_connection_is_a_rank_gone(linked):
    remote, link = linked
    assert not remote.lost()
    link.close()
    assert not remote.wait_done(2, 5)
    assert "lost its connection" in remote.failure


def test_a_rank_that_ends_behind_answers_not_read_yet_is_lost(linked):
    # rank 0 reads the answers between its steps; the watcher thread must see the end behind them
    remote, link = linked
    link.mark_done()
    link.write_error("RuntimeError: out of memory")
    link.close()
    deadline = time.monotonic() + 5
    while not remote.lost() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert remote.lost()
    assert not remote.alive() and remote.marks == 2 and remote.failure.endswith("out of memory")


def test_rank_0_gone_is_an_error_for_the_rank(linked):
    remote, link = linked
    remote.close()
    with pytest.raises(ConnectionError, match="rank 0 closed the connection"):
        link.receive()


def test_ranks_that_never_connect_are_named():
    listener = RankListener("127.0.0.1")
    try:
        with pytest.raises(RuntimeError, match=r"ranks \[2, 3\] \(node\(s\) \[1\]\) did not connect within 0 s"):
            listener.accept(range(2, 4), ranks_per_node=2, timeout=0.2)
    finally:
        listener.close()
