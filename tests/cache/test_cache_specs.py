"""Cache specs: equal specs are one group, whatever layers they sit in; each kind is its own group."""

import ast
from pathlib import Path

import nanovllm.cache
from nanovllm.cache.specs import FullAttention, RecurrentState, SharedKV, SlidingWindow, group_layers

GATED_DELTANET = RecurrentState(shapes=((96, 3), (4, 16, 32)), dtypes=(None, "float32"))


def test_layers_of_equal_specs_form_one_group_in_the_order_of_their_first_layer():
    specs = [SlidingWindow(4, 32, 512)] * 5 + [FullAttention(4, 32)] + [SlidingWindow(4, 32, 512)] * 5
    specs += [FullAttention(4, 32)]
    assert group_layers(specs) == {
        SlidingWindow(4, 32, 512): (0, 1, 2, 3, 4, 6, 7, 8, 9, 10),
        FullAttention(4, 32): (5, 11),
    }


def test_specs_that_differ_in_any_field_or_kind_are_groups_of_their_own():
    specs = [
        FullAttention(4, 32),
        FullAttention(4, 64),  # a global layer with larger heads (Gemma 4)
        FullAttention(2, 32),
        SlidingWindow(4, 32, 128),
        SlidingWindow(4, 32, 256),
        GATED_DELTANET,
        SharedKV(source_layer=0),
        SharedKV(source_layer=3),
    ]
    assert list(group_layers(specs).values()) == [(i,) for i in range(len(specs))]


def test_recurrent_layers_with_the_same_states_share_a_group_beside_full_attention():
    # Qwen3.5's pattern: three Gated DeltaNet layers to one full-attention layer
    state = RecurrentState(shapes=((96, 3), (4, 16, 32)), dtypes=(None, "float32"))
    specs = ([GATED_DELTANET] * 3 + [FullAttention(2, 64)]) * 2
    assert group_layers(specs) == {state: (0, 1, 2, 4, 5, 6), FullAttention(2, 64): (3, 7)}
    assert hash(state) == hash(GATED_DELTANET)


def test_the_cache_package_imports_nothing_of_the_tiers_above_it_nor_torch():
    # layers, worker and models all read the specs: one import of theirs here would make a circle
    for path in Path(nanovllm.cache.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            outside = [n for n in names if n.startswith(("nanovllm", "torch")) and not n.startswith("nanovllm.cache.")]
            assert not outside, (path.name, names)
