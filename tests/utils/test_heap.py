import gc

from nanovllm.utils.heap import freeze_start_up_objects, unfreeze_objects


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
