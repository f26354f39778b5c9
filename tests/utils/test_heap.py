"""The cycle collector: start-up objects frozen out of its reach, and paused for bursts of acyclic objects."""

import gc

from nanovllm.utils.heap import collector_paused, freeze_start_up_objects, unfreeze_objects


class Node:
    pass


def tracked(obj) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_freezing_collects_garbage_first_then_hides_the_live_objects_until_unfrozen():
    try:
        live = Node()
        cycle = Node()
        cycle.self = cycle
        garbage = id(cycle)
        del cycle
        freeze_start_up_objects()
        assert not tracked(live)
        assert all(id(o) != garbage for o in gc.get_objects())
        made_after = Node()
        assert tracked(made_after)
    finally:
        unfreeze_objects()
    assert tracked(live)
    assert gc.get_freeze_count() == 0


def test_the_collector_is_paused_inside_the_block_and_restored_after():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()
