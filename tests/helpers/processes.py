"""The processes a process started, and whether one runs, read from /proc."""

import os


def child_processes(pid: int) -> list[int]:
    """The processes `pid` started, but Python's multiprocessing resource tracker, which every
    program that spawns processes has (it ends with its parent)."""
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and b"resource_tracker" not in command:
            children.append(int(entry))
    return children


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, which has ended, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
