"""Commands from rank 0 to the worker processes of its machine through one shared-memory segment: a ring of
`RING_SLOTS` slots that rank 0 fills without waiting for the workers to have run the commands before.

Layout of the segment (every counter a native 8-byte word, 8-aligned):

    [per worker: commands consumed, marks done]
    [RING_SLOTS slots: sequence number, data offset, data length]
    [data: `capacity` bytes, a ring of the commands' bytes]
    [one error slot per worker]

Rank 0 writes command `seq` into slot `seq % RING_SLOTS` (its bytes at the
next place in the data ring that holds them whole) and posts every worker's
`ready` semaphore. Each worker takes the commands in order: it waits on its
semaphore, copies the command out and counts it consumed, which frees the slot
and its bytes once every worker has; it later counts a "mark" done once the
command ran (`mark_done`), which rank 0 waits for only where it relies on the
command's effect (`wait_done`). Rank 0 waits for room only when the ring is
full: the oldest command not yet consumed by every worker holds the slot or
the bytes it needs. A worker that fails writes its error into its own slot
before it exits. Tensors never travel here.

Each counter has one writer, and a native 8-byte store or load is never
torn, so readers see a count that only grows; the semaphores order the
command's bytes before the worker reads them. Semaphores rather than
`multiprocessing.Event`s, which guard their flag with a lock, cannot be left
locked by a worker killed at the wrong moment.
"""

import struct
import time
from multiprocessing.context import BaseContext
from multiprocessing.shared_memory import SharedMemory

# Rank 0 runs only two or three steps ahead of a worker anyway (the model's collectives hold its device to the
# worker's, and the engine reads each step's samples back soon after launching the next); the other slots let
# a worker fall behind for a moment (a garbage collection, a long prefill's inputs) without holding rank 0 up.
RING_SLOTS = 8
_WORD = struct.Struct("Q")  # native: one store, one load
_SLOT = struct.Struct("QQQ")  # sequence number, data offset, data length
_ERROR_LENGTH = struct.Struct("<Q")
_ERROR_SLOT = 4096
_POLL_S = 0.0002  # how often a waiting rank 0 reads the workers' counters


class CommandChannel:
    """A shared-memory ring of commands (bytes) from rank 0 to `num_workers` workers, with semaphores to wake
    them; each command at most `capacity` bytes.

    Built by rank 0 (which owns and finally unlinks the segment); handed to the
    workers as a `Process` argument, which re-attaches them to the same segment.
    """

    def __init__(self, num_workers: int, capacity: int, context: BaseContext):
        self.num_workers = num_workers
        self.capacity = capacity
        self._slots_at = 2 * _WORD.size * num_workers
        self._data_at = self._slots_at + RING_SLOTS * _SLOT.size
        self._errors_at = self._data_at + (capacity + 7) // 8 * 8
        self.shm = SharedMemory(create=True, size=self._errors_at + num_workers * _ERROR_SLOT)
        self.ready = [context.Semaphore(0) for _ in range(num_workers)]
        self.posted = 0  # rank 0: commands posted
        self._starts: list[int] = [0] * RING_SLOTS  # rank 0: where each slot's command begins, in bytes ever written
        self._end = 0  # rank 0: bytes ever written, padding included

    @property
    def name(self) -> str:
        """The segment's name (unique: the system picks it)."""
        return self.shm.name

    def _counter(self, worker: int, which: int) -> int:
        return _WORD.unpack_from(self.shm.buf, (2 * worker + which) * _WORD.size)[0]

    def consumed(self, worker: int) -> int:
        """How many commands `worker` has copied out of the ring."""
        return self._counter(worker, 0)

    def marks(self, worker: int) -> int:
        """How many marks `worker` has made (`mark_done`)."""
        return self._counter(worker, 1)

    def _place(self, length: int) -> int | None:
        """Where in bytes ever written the next command of `length` bytes goes, or None while the ring is full."""
        oldest = min((self.consumed(w) for w in range(self.num_workers)), default=self.posted)
        if self.posted - oldest >= RING_SLOTS:
            return None
        if oldest == self.posted:  # every command consumed: start the data ring over
            return -(-self._end // self.capacity) * self.capacity
        offset = self._end % self.capacity
        start = self._end if offset + length <= self.capacity else self._end + self.capacity - offset
        return start if start + length - self._starts[oldest % RING_SLOTS] <= self.capacity else None

    def wait_for_room(self, length: int, timeout: float) -> bool:
        """Rank 0: whether the ring has room for a command of `length` bytes within `timeout` seconds."""
        if length > self.capacity:
            raise RuntimeError(
                f"a command of {length} bytes, more than the {self.capacity}-byte channel; this is a bug in sizing "
                "the channel"
            )
        deadline = time.monotonic() + timeout
        while self._place(length) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def post(self, data: bytes) -> None:
        """Rank 0: write a command into the ring, which has room for it (`wait_for_room`), and wake every worker."""
        start = self._place(len(data))
        assert start is not None, "posted to a full ring"
        offset = start % self.capacity
        seq = self.posted
        buf = self.shm.buf
        buf[self._data_at + offset : self._data_at + offset + len(data)] = data
        _SLOT.pack_into(buf, self._slots_at + seq % RING_SLOTS * _SLOT.size, seq, offset, len(data))
        self._starts[seq % RING_SLOTS] = start
        self._end = start + len(data)
        self.posted = seq + 1
        for ready in self.ready:
            ready.release()

    def receive(self, worker: int) -> bytes:
        """Worker `worker`: block until rank 0 posts its next command; the command's bytes."""
        self.ready[worker].acquire()
        seq = self.consumed(worker)
        slot_seq, offset, length = _SLOT.unpack_from(self.shm.buf, self._slots_at + seq % RING_SLOTS * _SLOT.size)
        assert slot_seq == seq, f"worker {worker} expected command {seq}, the slot holds {slot_seq}"
        data = bytes(self.shm.buf[self._data_at + offset : self._data_at + offset + length])
        _WORD.pack_into(self.shm.buf, 2 * worker * _WORD.size, seq + 1)  # the slot is free for rank 0
        return data

    def mark_done(self, worker: int) -> None:
        """Worker `worker`: one more step done (reached the rendezvous, built its runner, ran a command)."""
        _WORD.pack_into(self.shm.buf, (2 * worker + 1) * _WORD.size, self.marks(worker) + 1)

    def wait_done(self, worker: int, marks: int, timeout: float) -> bool:
        """Rank 0: whether `worker` has made `marks` marks within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.marks(worker) < marks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def _error_slot(self, worker: int) -> int:
        return self._errors_at + worker * _ERROR_SLOT

    def write_error(self, worker: int, message: str) -> None:
        """Worker: leave a (possibly truncated) error message for rank 0."""
        data = message.encode()[: _ERROR_SLOT - _ERROR_LENGTH.size]
        start = self._error_slot(worker)
        _ERROR_LENGTH.pack_into(self.shm.buf, start, len(data))
        self.shm.buf[start + _ERROR_LENGTH.size : start + _ERROR_LENGTH.size + len(data)] = data

    def read_error(self, worker: int) -> str:
        """Rank 0: the message `worker` left, or '' if none."""
        start = self._error_slot(worker)
        (length,) = _ERROR_LENGTH.unpack_from(self.shm.buf, start)
        data = bytes(self.shm.buf[start + _ERROR_LENGTH.size : start + _ERROR_LENGTH.size + length])
        return data.decode(errors="replace")

    def close(self, unlink: bool = False) -> None:
        """Detach from the segment; rank 0 also removes it (`unlink=True`)."""
        self.shm.close()
        if unlink:
            self.shm.unlink()
