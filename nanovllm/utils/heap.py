"""The cycle collector and the objects that start-up leaves behind."""

import gc


def freeze_start_up_objects() -> None:
    """Collect start-up's garbage, then move every object still alive out of the collector's reach.

    Start-up leaves hundreds of thousands of tracked objects (imported modules,
    the tokenizer, the model's Python side) that live as long as the engine. A
    full collection walks them all: a stall of the step loop that lands at a
    random step. Frozen, they are skipped, and a full collection is short.
    Objects frozen here are still freed by reference counting; only cycles
    among them wait for `unfreeze_objects`.
    """
    gc.collect()
    gc.freeze()


def unfreeze_objects() -> None:
    """Give the frozen objects back to the collector, so that cycles among a closed engine's objects
    are collected."""
    gc.unfreeze()
