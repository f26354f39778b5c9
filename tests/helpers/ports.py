"""A free port for a server a test starts."""

import socket


def free_port() -> int:
    """A TCP port of 127.0.0.1 that no socket holds now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
