"""A varlen step's inputs on a model with recurrent layers: the sequences of one query (decodes beside prompt
chunks), their token rows and the other sequences, which the recurrent layers step apart."""

from dataclasses import replace

import numpy as np
import torch

from nanovllm.worker.varlen_inputs import varlen_inputs
from nanovllm.worker.warm_up import start_up_step


def to_device(values, dtype):
    return torch.from_numpy(values).to(dtype) if isinstance(values, np.ndarray) else torch.tensor(values, dtype=dtype)


def step(token_ids: list[list[int]]):
    out = start_up_step(token_ids, [4] * len(token_ids), [[[0, 1]]] * len(token_ids))
    return replace(out, state_slots=list(range(len(token_ids))))


def test_the_sequences_of_one_query_their_rows_and_the_others():
    context = varlen_inputs(step([[5], [6, 7, 8], [9], [1, 2]]), [-1] * 4, 16, False, to_device, has_state=True)[0]
    one_query = context.one_query
    assert one_query.seqs.tolist() == [0, 2] and one_query.rows.tolist() == [0, 4]
    assert one_query.others.tolist() == [1, 3] and one_query.num_others == 2


def test_none_without_recurrent_layers_or_sequences_of_one_query():
    assert varlen_inputs(step([[5], [6, 7]]), [-1] * 2, 16, False, to_device)[0].one_query is None
    assert varlen_inputs(step([[5, 6], [7, 8]]), [-1] * 2, 16, False, to_device, has_state=True)[0].one_query is None
