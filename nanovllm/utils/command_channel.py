"""Commands from rank 0 to the worker processes through one shared-memory segment.

Layout of the segment:

    [8 bytes: command length][command: pickled (method name, args)] ... [one error slot per worker]

Rank 0 writes a command and signals every worker's `ready` event; each worker
reads it, runs it and signals its `done` event. Rank 0 writes the next command
only after every worker is done, so one buffer is enough. A worker that fails
writes its error into its own slot before it exits. Tensors never travel here.

The events are bare semaphores (one post per command): unlike
`multiprocessing.Event`, which guards its flag with a lock, they cannot be left
locked by a worker killed at the wrong moment.
"""

import pickle
import struct
from multiprocessing.context import BaseContext
from multiprocessing.shared_memory import SharedMemory

_LENGTH = struct.Struct("<Q")
_ERROR_SLOT = 4096


def encode_command(method: str, *args) -> bytes:
    """The bytes of a command: the pickled (method name, args), as the channel and `rank_link` carry it."""
    return pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)


class CommandChannel:
    """A shared-memory mailbox from rank 0 to `num_workers` workers, with events to wake them.

    Built by rank 0 (which owns and finally unlinks the segment); handed to the
    workers as a `Process` argument, which re-attaches them to the same segment.
    """

    def __init__(self, num_workers: int, capacity: int, context: BaseContext):
        self.num_workers = num_workers
        self.capacity = capacity
        self.shm = SharedMemory(create=True, size=_LENGTH.size + capacity + num_workers * _ERROR_SLOT)
        self.ready = [context.Semaphore(0) for _ in range(num_workers)]
        self.done = [context.Semaphore(0) for _ in range(num_workers)]

    @property
    def name(self) -> str:
        """The segment's name (unique: the system picks it)."""
        return self.shm.name

    def send(self, method: str, *args) -> None:
        """Rank 0: post a command and wake every worker."""
        self.send_encoded(encode_command(method, *args))

    def send_encoded(self, data: bytes) -> None:
        """Rank 0: post a command `encode_command` made and wake every worker."""
        if len(data) > self.capacity:
            raise RuntimeError(
                f"a command of {len(data)} bytes, more than the {self.capacity}-byte channel; this is a bug in "
                "sizing the channel"
            )
        buf = self.shm.buf
        _LENGTH.pack_into(buf, 0, len(data))
        buf[_LENGTH.size : _LENGTH.size + len(data)] = data
        for ready in self.ready:
            ready.release()

    def receive(self, worker: int) -> tuple[str, tuple]:
        """Worker: block until rank 0 posts a command; returns (method name, args)."""
        self.ready[worker].acquire()
        (length,) = _LENGTH.unpack_from(self.shm.buf, 0)
        return pickle.loads(self.shm.buf[_LENGTH.size : _LENGTH.size + length])

    def mark_done(self, worker: int) -> None:
        """Worker: the command ran."""
        self.done[worker].release()

    def wait_done(self, worker: int, timeout: float) -> bool:
        """Rank 0: whether `worker` finished the command within `timeout` seconds."""
        return self.done[worker].acquire(timeout=timeout)

    def _error_slot(self, worker: int) -> int:
        return _LENGTH.size + self.capacity + worker * _ERROR_SLOT

    def write_error(self, worker: int, message: str) -> None:
        """Worker: leave a (possibly truncated) error message for rank 0."""
        data = message.encode()[: _ERROR_SLOT - _LENGTH.size]
        start = self._error_slot(worker)
        _LENGTH.pack_into(self.shm.buf, start, len(data))
        self.shm.buf[start + _LENGTH.size : start + _LENGTH.size + len(data)] = data

    def read_error(self, worker: int) -> str:
        """Rank 0: the message `worker` left, or '' if none."""
        start = self._error_slot(worker)
        (length,) = _LENGTH.unpack_from(self.shm.buf, start)
        return bytes(self.shm.buf[start + _LENGTH.size : start + _LENGTH.size + length]).decode(errors="replace")

    def close(self, unlink: bool = False) -> None:
        """Detach from the segment; rank 0 also removes it (`unlink=True`)."""
        self.shm.close()
        if unlink:
            self.shm.unlink()
