"""Helpers for the processes the engine spawns (the engine core, tensor-parallel workers)."""

import multiprocessing as mp
import os
import signal
import threading


def exit_with_parent() -> None:
    """Exit this spawned process as soon as the process that spawned it is gone, whatever it is doing."""
    parent = mp.parent_process()

    def exit_when_orphaned() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=exit_when_orphaned, daemon=True).start()


def ignore_interrupts() -> None:
    """Ctrl-C reaches the whole process group; the process that spawned this one handles it and stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
