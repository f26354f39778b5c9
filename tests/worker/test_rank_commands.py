"""The commands rank 0 sends the other ranks: each step decodes to the step without its sampling settings, its
block tables whole, and how its rows are drawn, while a decode step's bytes do not grow with the context."""

import random

from nanovllm.core.kv_cache_manager import NO_BLOCK
from nanovllm.core.scheduler_output import PLACEHOLDER, PromptScoring, SchedulerOutput
from nanovllm.sample.metadata import DecodeDraw
from nanovllm.sampling_params import SamplingParams
from nanovllm.worker.rank_commands import CommandDecoder, CommandEncoder, encode_call


def decode_step(req_ids: list[str], tables: dict[str, list[list[int]]]) -> SchedulerOutput:
    n = len(req_ids)
    return SchedulerOutput(
        req_ids,
        [[PLACEHOLDER]] * n,
        [16 * len(tables[r][0]) - 1 for r in req_ids],
        [tables[r] for r in req_ids],
        [True] * n,
        list(req_ids),
        [SamplingParams(temperature=0.5)] * n,
        [3] * n,
        state_slots=[-1] * n,
    )


def test_steps_decode_to_the_step_less_its_sampling_through_every_kind_of_table_change():
    rng = random.Random(0)
    # two cache groups: full attention, and a sliding window that gives back a leading run
    tables = {f"r{i}": [list(range(100 * i, 100 * i + 3)), list(range(100 * i + 50, 100 * i + 53))] for i in range(6)}
    encoder, decoder = CommandEncoder(), CommandDecoder()
    for _ in range(60):
        running = sorted(rng.sample(sorted(tables), 4))  # requests leave a step and come back
        for req_id in running:
            full, sliding = tables[req_id]
            change = rng.randrange(5)
            if change == 0:
                full.append(rng.randrange(10_000))
                sliding.append(rng.randrange(10_000))
            elif change == 1:
                given_back = sliding.index(next((b for b in sliding if b != NO_BLOCK), sliding[-1]))
                sliding[: min(len(sliding), given_back + 2)] = [NO_BLOCK] * min(len(sliding), given_back + 2)
            elif change == 2:  # preempted and admitted again: new lists
                tables[req_id] = [[rng.randrange(10_000) for _ in range(4)], [NO_BLOCK, rng.randrange(10_000)]]
        out = decode_step(running, tables)
        draw = DecodeDraw([rng.choice([0.0, 0.5]) for _ in running], rng.random() < 0.5, rng.choice([None, 3]))
        method, (got, got_draw) = decoder.decode(encoder.step(out, draw))
        assert method == "run_step" and got == out.without_sampling() and got_draw == draw


def test_a_step_with_prompt_scoring_and_state_copies_crosses():
    out = SchedulerOutput(
        ["a"],
        [[5, 6, 7]],
        [0],
        [[[1, 2]]],
        [True],
        ["a"],
        [SamplingParams()],
        [0],
        prompt_scoring=[PromptScoring("a", 0, 1, 2, [6, 7])],
        next_token_ids=[PLACEHOLDER],
        state_slots=[4],
        state_restores=[(-1, 4)],
        state_snapshots=[(4, 9)],
    )
    assert CommandDecoder().decode(CommandEncoder().step(out, None)) == ("run_step", (out.without_sampling(), None))


def test_a_decode_step_takes_a_few_bytes_per_request_at_any_context_length():
    sizes = []
    for blocks in (4, 64, 1024):
        tables = {f"r{i}": [list(range(blocks))] for i in range(256)}
        encoder = CommandEncoder()
        draw = DecodeDraw([0.7] * 256, True)
        encoder.step(decode_step(sorted(tables), tables), draw)  # the first step sends the tables whole
        for table in list(tables.values())[::16]:
            table[0].append(7)
        sizes.append(len(encoder.step(decode_step(sorted(tables), tables), draw)))
    # only the integers' widths grow (a position of 16k tokens takes 3 bytes where one of 64 takes 1)
    assert max(sizes) <= 41 * 256 and sizes[2] - sizes[0] <= 4 * 256


def test_a_call_crosses_by_name():
    assert CommandDecoder().decode(encode_call("exit")) == ("exit", ())
    assert CommandDecoder().decode(encode_call("run", [1, 2], {"x": 3})) == ("run", ([1, 2], {"x": 3}))
