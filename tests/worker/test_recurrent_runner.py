"""A model runner over a model with recurrent layers (the tiny Qwen3 followed by decaying-sum layers of two
state groups): it sizes and binds the state cache, hands each step's sequences their state slots (padded decode
rows the scratch slot), zeroes or restores a new request's live slot before the forward pass and snapshots it
after; a request restored from a snapshot continues as the request that took it."""

import pytest
import torch

from nanovllm.config import Config
from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.worker.model_runner import ModelRunner

from helpers.graphs_replayed_eagerly import GraphsReplayedEagerly
from helpers.prompts import random_prompts
from helpers.recurrent_models import HIDDEN, with_recurrent_layers

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture
def runner(qwen3_dir, monkeypatch) -> ModelRunner:
    with_recurrent_layers(monkeypatch)
    config = Config(qwen3_dir, device="cpu", block_size=BLOCK, num_kvcache_blocks=16, max_model_len=128, max_num_seqs=4)
    return ModelRunner(config)


def step(
    tokens: list[list[int]],
    starts: list[int],
    tables: list[list[int]],
    slots: list[int],
    restores=(),
    snapshots=(),
    samples: bool = True,
) -> SchedulerOutput:
    """Requests r0, r1 ... computing `tokens[i]` from position `starts[i]`, with block table `tables[i]` (one
    cache group) and state slot `slots[i]`; every request samples, or none."""
    n = len(tokens)
    req_ids = [f"r{i}" for i in range(n)]
    sampled = req_ids if samples else []
    return SchedulerOutput(
        req_ids,
        tokens,
        starts,
        [[table] for table in tables],
        [samples] * n,
        sampled,
        [GREEDY] * len(sampled),
        [0] * len(sampled),
        state_slots=slots,
        state_restores=list(restores),
        state_snapshots=list(snapshots),
    )


def sampled(runner: ModelRunner, out: SchedulerOutput) -> list[int]:
    """The ids the step samples (none where it samples nothing)."""
    pending = runner.execute(out)
    return [] if pending is None else [int(ids[0]) for ids in pending.result().sampled_token_ids]


def test_the_state_cache_is_sized_and_each_recurrent_layer_bound_to_its_groups_views(runner):
    # blocks set by the user: the slots take what cpu_kvcache_gb leaves, at most three per sequence
    assert runner.num_state_slots == 3 * 4 and runner.state_cache.num_slots == 12
    assert runner.recurrent_layers == list(runner.model.recurrent)
    (sums,), (sums_with_count, counts) = runner.state_cache.tensors  # layers 2 and 4; layer 3
    assert sums.shape == (2, 13, HIDDEN) and counts.shape == (1, 13, 1) and counts.dtype == torch.float64
    bound = [[t.data_ptr() for t in layer.states] for layer in runner.recurrent_layers]
    assert bound == [[sums[0].data_ptr()], [sums_with_count[0].data_ptr(), counts[0].data_ptr()], [sums[1].data_ptr()]]
    assert runner.decode_buffers.scratch_state_slot == 12
    assert runner.start_up.state_cache_bytes == runner.state_cache.nbytes == 13 * (3 * HIDDEN * 4 + 8)


def test_a_new_requests_slot_is_zeroed_before_its_step_and_its_state_carries_over_chunks_and_decodes(runner):
    prompt = random_prompts([40], seed=5)[0]
    counts = runner.state_cache.tensors[1][1][0, :, 0]  # [slots + 1]: tokens seen by layer 3's sequence in each slot
    fresh = sampled(runner, step([prompt], [0], [[0, 1, 2]], [7]))
    # every slot held other requests' states: the restore zeroes the request's, which starts from nothing
    for t in (t for states in runner.state_cache.tensors for t in states):
        t.fill_(5.0)
    first = sampled(runner, step([prompt[:24]], [0], [[0, 1, 2]], [7], restores=[(-1, 7)], samples=False))
    assert first == [] and counts[7] == 24
    tokens = sampled(runner, step([prompt[24:]], [24], [[0, 1, 2]], [7], snapshots=[(7, 3)]))
    assert tokens == fresh and counts[7] == counts[3] == 40
    for position in range(40, 44):
        tokens += sampled(runner, step([tokens[-1:]], [position], [[0, 1, 2]], [7]))
    assert counts[7] == 44 and counts[3] == 40  # the snapshot kept the state of the prompt
    # every forward handed each layer the request's slot
    assert all(calls == [[7]] * 7 for calls in (layer.calls for layer in runner.recurrent_layers))


def test_a_request_restored_from_a_snapshot_continues_as_the_request_that_took_it(runner):
    prompt = random_prompts([40], seed=6)[0]
    logits = []
    compute_logits = runner.model.compute_local_logits
    runner.model.compute_local_logits = lambda *args: logits.append(compute_logits(*args)) or logits[-1]
    # the first request's prompt ends on a block boundary (32 tokens): its state there is snapshotted to slot 5
    tokens = sampled(runner, step([prompt[:32]], [0], [[0, 1]], [4], [(-1, 4)], [(4, 5)]))
    tokens = sampled(runner, step([prompt[32:]], [32], [[0, 1, 2]], [4]))
    # the second shares the first two blocks and the snapshot, and computes the rest of the prompt
    restored = sampled(runner, step([prompt[32:]], [32], [[0, 1, 3]], [6], restores=[(5, 6)]))
    assert restored == tokens
    torch.testing.assert_close(logits[-1], logits[-2])
    for states in runner.state_cache.tensors:
        for t in states:
            torch.testing.assert_close(t[:, 6], t[:, 4])
    # from zeros instead, the state misses the prefix's tokens: another result
    runner.state_cache.copy_states([(-1, 6)])
    sampled(runner, step([prompt[32:]], [32], [[0, 1, 3]], [6]))
    assert not torch.allclose(logits[-1], logits[-2], atol=1e-3)


def test_a_padded_decode_steps_rows_have_their_slots_and_padding_the_scratch_slot(runner):
    runner.graphs = GraphsReplayedEagerly(runner)  # the graph path: three sequences padded to four
    prompts = random_prompts([5, 9, 3], seed=7)
    tables, slots = [[0], [1], [2]], [9, 2, 5]
    restores = [(-1, slot) for slot in slots]
    first = sampled(runner, step(prompts, [0, 0, 0], tables, slots, restores))
    second = sampled(runner, step([[t] for t in first], [5, 9, 3], tables, slots))
    assert runner.graphs.replays == [(4, 1)]
    scratch = runner.state_cache.scratch_slot
    assert all(layer.calls == [slots, slots + [scratch]] for layer in runner.recurrent_layers)
    # each sequence's state holds its own tokens alone: run alone, each gives the same tokens
    counts = runner.state_cache.tensors[1][1][0, :, 0]
    assert [counts[s].item() for s in slots] == [6, 10, 4]
    for prompt, table, slot, token, next_token in zip(prompts, tables, slots, first, second):
        alone = sampled(runner, step([prompt], [0], [table], [slot], [(-1, slot)]))
        assert alone == [token]
        assert sampled(runner, step([[token]], [len(prompt)], [table], [slot])) == [next_token]
