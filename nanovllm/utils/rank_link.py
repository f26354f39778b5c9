"""Commands from rank 0 to the ranks of other nodes over TCP: what `CommandChannel` is to the ranks of
rank 0's own machine, which shared memory and semaphores cannot reach.

Every rank of a node other than 0 connects to rank 0's `RankListener` (whose
port rank 0 publishes in the rendezvous store) and says which rank it is. Each
message is a frame, [1 byte kind][8 bytes length][payload]: rank 0 sends a
command (the same bytes the channel carries) without waiting for the commands
before it to have run, and the rank answers "done" once one ran (a mark, as a
channel's worker makes), or "error" with its message before it exits; rank 0
reads the answers as they come and waits for them only where it relies on a
command's effect. A closed connection is a rank gone: the kernel closes the sockets of a
killed process at once, and keep-alive probes notice a machine that vanished
within `_KEEPALIVE_S` seconds. A rank likewise exits when rank 0's end closes.
Tensors never travel here; the commands are small (a step's token and block ids).

The connections are not authenticated (nor is torch.distributed's store):
the nodes must share a trusted network.
"""

import select
import socket
import struct
import time

_FRAME = struct.Struct("<cQ")
_HELLO, _COMMAND, _DONE, _ERROR = b"H", b"C", b"D", b"E"
_RANK = struct.Struct("<Q")
# the peer closed its end (Linux reports that even with data still unread), or the connection broke
_HUNG_UP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR
_KEEPALIVE_S = (5, 2, 5)  # idle seconds before the first probe, seconds between probes, probes: ~15 s
_HELLO_TIMEOUT_S = 10  # how long an accepted connection may take to say which rank it is
COMMAND_PORT_KEY = "nanovllm/rank_link_port"  # where rank 0 publishes its listener's port in the store


def _keep_alive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a step's command leaves at once
    idle, interval, count = _KEEPALIVE_S
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, name):  # Linux's names
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _send_frame(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    sock.sendall(_FRAME.pack(kind, len(payload)) + payload)


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    """`size` bytes, or None if the connection closed first."""
    parts, left = [], size
    while left:
        part = sock.recv(min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _receive_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The next (kind, payload), or None once the connection has closed."""
    header = _receive_exactly(sock, _FRAME.size)
    if header is None:
        return None
    kind, length = _FRAME.unpack(header)
    payload = _receive_exactly(sock, length)
    return None if payload is None else (kind, payload)


class RemoteRank:
    """Rank 0's end of the connection to rank `rank` of node `node`: sends commands, reads answers.

    `failure` is None while the rank is connected and well, then why it is not."""

    def __init__(self, rank: int, node: int, sock: socket.socket, address: str):
        self.rank = rank
        self.node = node
        self.address = address
        self.failure: str | None = None
        self._sock = sock
        # its marks so far: connecting is the first, as it met the rendezvous first (a channel's worker marks that)
        self.marks = 1

    def send(self, command: bytes) -> None:
        """Post a command without waiting for it to run; a rank that is gone is left to `alive` to report."""
        if self.failure is None:
            try:
                _send_frame(self._sock, _COMMAND, command)
            except OSError as e:
                self._lose(f"sending it a command failed ({e})")

    def wait_done(self, marks: int, timeout: float) -> bool:
        """Whether the rank has made `marks` marks ("done" answers, its connection the first) within `timeout`
        seconds (False also once it is gone)."""
        deadline = time.monotonic() + timeout
        while self.marks < marks and self.failure is None:
            self._read(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                break
        return self.marks >= marks

    def alive(self, timeout: float = 0.0) -> bool:
        """Whether the rank is still connected and well, reading what it sends within `timeout` seconds (its
        "done" answers do not cut the wait short: a rank that is exiting may still have some queued)."""
        deadline = time.monotonic() + timeout
        self._read(0.0)
        while self.failure is None and time.monotonic() < deadline:
            self._read(deadline - time.monotonic())
        return self.failure is None

    def lost(self) -> bool:
        """Whether the connection has closed or carries the rank's error, without reading it: safe from a
        thread other than the one that sends and waits. "done" answers not read yet may stand before the
        error or the end (rank 0 reads them only between its steps), so the kernel is also asked whether
        the rank hung up."""
        try:
            head = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            if head in (b"", _ERROR):
                return True
            poller = select.poll()
            poller.register(self._sock, _HUNG_UP)
            return bool(poller.poll(0))
        except BlockingIOError:
            return False
        except OSError:
            return True

    def describe(self) -> str:
        """Why the rank is gone, for the engine's error."""
        return f"tensor-parallel rank {self.rank} on node {self.node} ({self.address}) {self.failure}"

    def close(self) -> None:
        if self.failure is None:
            self.failure = "was disconnected by rank 0"
        self._sock.close()

    def _read(self, timeout: float) -> None:
        """Read the answers there are, waiting up to `timeout` seconds for the first."""
        deadline = time.monotonic() + timeout
        while self.failure is None:
            try:
                ready, _, _ = select.select([self._sock], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    return
                frame = _receive_frame(self._sock)
            except OSError as e:
                self._lose(f"lost its connection ({e})")
                return
            if frame is None:
                self._lose("lost its connection: its process or its machine has stopped")
            elif frame[0] == _ERROR:
                self._lose(f"failed: {frame[1].decode(errors='replace')}")
            else:
                assert frame[0] == _DONE, f"unexpected frame {frame[0]!r} from rank {self.rank}"
                self.marks += 1
                deadline = time.monotonic()

    def _lose(self, why: str) -> None:
        self.failure = why
        self._sock.close()


class RankListener:
    """Rank 0's listening socket on `host`, which the ranks of the other nodes connect to."""

    def __init__(self, host: str):
        self._sock = socket.create_server((host, 0))
        self.host = host
        self.port = self._sock.getsockname()[1]

    def accept(self, ranks: range, ranks_per_node: int, timeout: float) -> list[RemoteRank]:
        """The connections of `ranks`, once every one has connected; RuntimeError naming the missing ones
        after `timeout` seconds."""
        joined: dict[int, RemoteRank] = {}
        deadline = time.monotonic() + timeout
        while len(joined) < len(ranks):
            self._sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                missing = sorted(set(ranks) - set(joined))
                nodes = sorted({rank // ranks_per_node for rank in missing})
                for remote in joined.values():
                    remote.close()
                raise RuntimeError(
                    f"tensor-parallel ranks {missing} (node(s) {nodes}) did not connect within {timeout:.0f} s; "
                    f"start `nanovllm serve MODEL --headless --node-rank K` with the same --nnodes, "
                    f"--tensor-parallel-size, --master-addr {self.host} and --master-port on each of those nodes"
                ) from None
            remote = self._greet(sock, ranks, ranks_per_node)
            if remote is not None and remote.rank not in joined:
                joined[remote.rank] = remote
        return [joined[rank] for rank in ranks]

    def _greet(self, sock: socket.socket, ranks: range, ranks_per_node: int) -> RemoteRank | None:
        """The rank a new connection says it is; None (the connection closed) for anything else."""
        address = "{}:{}".format(*sock.getpeername()[:2])
        try:
            sock.settimeout(_HELLO_TIMEOUT_S)
            frame = _receive_frame(sock)
            sock.settimeout(None)
        except OSError:
            frame = None
        if frame is None or frame[0] != _HELLO or len(frame[1]) != _RANK.size or _RANK.unpack(frame[1])[0] not in ranks:
            sock.close()
            return None
        _keep_alive(sock)
        rank = _RANK.unpack(frame[1])[0]
        return RemoteRank(rank, rank // ranks_per_node, sock, address)

    def close(self) -> None:
        self._sock.close()


class RankLink:
    """A rank's end of its connection to rank 0 (on node 0 at host:port): takes commands, answers them."""

    def __init__(self, host: str, port: int, rank: int):
        self._sock = socket.create_connection((host, port), timeout=_HELLO_TIMEOUT_S)
        self._sock.settimeout(None)
        _keep_alive(self._sock)
        _send_frame(self._sock, _HELLO, _RANK.pack(rank))

    def receive(self) -> bytes:
        """Block until rank 0 sends a command; its bytes. ConnectionError once rank 0 is gone."""
        frame = _receive_frame(self._sock)
        if frame is None:
            raise ConnectionError("rank 0 closed the connection (its engine stopped or failed)")
        assert frame[0] == _COMMAND, f"unexpected frame {frame[0]!r} from rank 0"
        return frame[1]

    def mark_done(self) -> None:
        """One more step done (built the runner, ran a command)."""
        _send_frame(self._sock, _DONE)

    def write_error(self, message: str) -> None:
        """Leave an error message for rank 0 (if it still listens)."""
        try:
            _send_frame(self._sock, _ERROR, message.encode())
        except OSError:
            pass

    def close(self) -> None:
        self._sock.close()
