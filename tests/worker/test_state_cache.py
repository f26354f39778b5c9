"""The state cache of a layout with two state groups: its shapes on a rank (and the tensor-parallel split it
refuses), its zeroed allocation with a scratch slot, each recurrent layer bound to its group's views, and the
copies between slots (restores from zeros or from a slot, snapshots), each reading before any writes."""

import pytest
import torch

from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import FullAttention, RecurrentState
from nanovllm.worker.state_cache import StateCacheSpec

CONV = RecurrentState(((8, 3),), (None,))  # a short convolution's last inputs, in the model's dtype
DELTA = RecurrentState(((4, 2, 2), (6,)), ("float32", "float64"))  # two states of their own dtypes
# layers 0 and 3 attend; 1 and 4 keep CONV's state, 2 and 5 DELTA's
SPECS = [FullAttention(2, 16), CONV, DELTA] * 2
SLOTS = 5


def spec(world_size: int = 1) -> StateCacheSpec:
    return StateCacheSpec.of(cache_layout(SPECS), torch.bfloat16, world_size)


class StateProbe:
    """A recurrent layer that only keeps the states it is bound to."""

    def bind_state_cache(self, states):
        self.states = states


def test_the_spec_holds_each_groups_layers_shapes_and_dtypes_on_a_rank():
    conv, delta = spec().groups
    assert (conv.layers, conv.shapes, conv.dtypes) == ((1, 4), ((8, 3),), (torch.bfloat16,))
    assert (delta.layers, delta.shapes, delta.dtypes) == ((2, 5), ((4, 2, 2), (6,)), (torch.float32, torch.float64))
    per_layer = 8 * 3 * 2 + 4 * 2 * 2 * 4 + 6 * 8
    assert spec().slot_bytes == 2 * per_layer
    # two ranks: each state's first dimension halves
    conv, delta = spec(2).groups
    assert conv.shapes == ((4, 3),) and delta.shapes == ((2, 2, 2), (3,))
    assert spec(2).slot_bytes == 2 * (4 * 3 * 2 + 2 * 2 * 2 * 4 + 3 * 8)


def test_a_tensor_parallel_size_that_splits_a_state_unevenly_is_refused():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 must divide the first dimension.*\(6,\)"):
        spec(4)


def test_a_model_without_recurrent_layers_has_no_state_cache():
    assert StateCacheSpec.of(cache_layout([FullAttention(2, 16)] * 3), torch.float32, 1) is None


def test_the_cache_is_zeroed_with_a_scratch_slot_and_binds_each_layer_to_its_groups_views():
    cache = spec().allocate(SLOTS, "cpu")
    (conv,), (delta, count) = cache.tensors
    assert conv.shape == (2, SLOTS + 1, 8, 3) and conv.dtype == torch.bfloat16
    assert delta.shape == (2, SLOTS + 1, 4, 2, 2) and count.shape == (2, SLOTS + 1, 6) and count.dtype == torch.float64
    assert all(not t.any() for t in (conv, delta, count))
    assert cache.scratch_slot == SLOTS and cache.nbytes == (SLOTS + 1) * spec().slot_bytes
    probes = [StateProbe() for _ in range(4)]  # in module order: layers 1, 2, 4, 5
    cache.bind(probes)
    bound = [tuple(t.data_ptr() for t in probe.states) for probe in probes]
    assert bound == [
        (conv[0].data_ptr(),),
        (delta[0].data_ptr(), count[0].data_ptr()),
        (conv[1].data_ptr(),),
        (delta[1].data_ptr(), count[1].data_ptr()),
    ]
    assert probes[3].states[1].shape == (SLOTS + 1, 6)
    # a write through layer 5's view lands in its row of the group's tensor
    probes[3].states[0][2, 1, 0, 1] = 7.0
    assert delta[1, 2, 1, 0, 1] == 7.0 and delta.count_nonzero() == 1
    cache.unbind(probes)  # as after the start-up steps on the scratch slot alone
    assert all(probe.states is None for probe in probes)


def test_binding_refuses_a_module_count_other_than_the_recurrent_layers():
    with pytest.raises(ValueError):
        spec().allocate(SLOTS, "cpu").bind([StateProbe() for _ in range(3)])


def filled(cache) -> list[torch.Tensor]:
    """Every state tensor, each slot s of each layer filled with 10 * layer + s + 1 (slot 4: NaN)."""
    tensors = [t for states in cache.tensors for t in states]
    for t in tensors:
        for layer in range(t.size(0)):
            for slot in range(t.size(1)):
                t[layer, slot] = float("nan") if slot == 4 else 10 * layer + slot + 1
    return tensors


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)  # on CUDA distinct slots take the copy kernel
def test_restores_zero_a_slot_or_copy_another_into_it_in_every_layer_and_state(device):
    cache = spec().allocate(SLOTS, device)
    tensors = filled(cache)
    before = [t.clone() for t in tensors]
    cache.copy_states([(-1, 4), (1, 3)])  # slot 4 held NaN: zeroed all the same
    for t, old in zip(tensors, before):
        assert not t[:, 4].any()
        assert torch.equal(t[:, 3], old[:, 1])
        assert torch.equal(t[:, [0, 1, 2, 5]], old[:, [0, 1, 2, 5]])  # nothing else moved


@pytest.mark.parametrize("device", DEVICES)
def test_copies_read_every_source_before_writing_any_destination(device):
    # a snapshot into slot 2 and a restore from slot 2 in one list: the restore takes slot 2's old states
    cache = spec().allocate(SLOTS, device)
    tensors = filled(cache)
    before = [t.clone() for t in tensors]
    cache.copy_states([(0, 2), (2, 1)])
    for t, old in zip(tensors, before):
        assert torch.equal(t[:, 2], old[:, 0]) and torch.equal(t[:, 1], old[:, 2])
