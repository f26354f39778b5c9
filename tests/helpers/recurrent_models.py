"""A tiny model with recurrent layers, built from the tiny Qwen3: its hidden states pass through layers that keep
a decaying running sum per sequence in state slots, so the runner's binding, restores, snapshots and
`Context.state_slots` decide what it outputs.

`with_recurrent_layers(monkeypatch)` makes every engine built afterwards in the test treat the tiny model so:
its config's cache layout gains the recurrent layers' state groups (`RECURRENT_SPECS`), and the runner wraps
the model it builds (`WithRecurrentLayers`).
"""

import torch
from torch import nn

from nanovllm import config as config_module
from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import RecurrentState
from nanovllm.layers.recurrent_state import RecurrentLayer
from nanovllm.utils.context import get_context
from nanovllm.worker import model_runner

HIDDEN = 64  # the tiny models' hidden size
# two state groups: a decaying sum in float32; a decaying sum in the model's dtype and a token count in float64
SUM = RecurrentState(((HIDDEN,),), ("float32",))
SUM_AND_COUNT = RecurrentState(((HIDDEN,), (1,)), (None, "float64"))
RECURRENT_SPECS = (SUM, SUM_AND_COUNT, SUM)  # decoder layers 2, 3 and 4, after the tiny model's two attention layers
DECAY = 0.99  # each token's share of the state decays by this factor per later token


class DecayingSum(RecurrentLayer):
    """A recurrent layer whose state is a decaying sum of its inputs ([HIDDEN] per sequence; after a token,
    DECAY * the state before it + its input), and, where it has a second state, the number of tokens seen;
    it outputs (1 - DECAY) * the state after each token, a running average of about 1 / (1 - DECAY) tokens.
    A decode step runs without a host sync, so that CUDA graphs capture it. `calls` records each forward's
    `Context.state_slots` (None outside a model with state) where it runs outside a graph capture."""

    def __init__(self):
        super().__init__()
        self.states: tuple[torch.Tensor, ...] | None = None
        self.calls: list[list[int] | None] = []

    def bind_state_cache(self, states: tuple[torch.Tensor, ...] | None) -> None:
        self.states = states

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [tokens, HIDDEN] -> [tokens, HIDDEN]
        context = get_context()
        slots = context.state_slots  # [sequences]
        if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.calls.append(None if slots is None else slots.tolist())
        if context.is_prefill:
            runs = [self._prefill(part, slots[i]) for i, part in enumerate(x.split(context.seqlens_q))]
            return (1 - DECAY) * torch.cat(runs).to(x.dtype)
        # one token per sequence; padding rows share the scratch slot, whose state nothing reads back
        state = DECAY * self.states[0][slots].float() + x.float()  # [sequences, HIDDEN]
        self.states[0][slots] = state.to(self.states[0].dtype)
        if len(self.states) > 1:
            self.states[1][slots] += 1
        return ((1 - DECAY) * state).to(x.dtype)

    def _prefill(self, x: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """The states after each of one sequence's tokens `x` ([n, HIDDEN]), from its slot's state (zeros
        before binding, which stores nothing)."""
        steps = torch.arange(x.size(0), device=x.device)
        ages = (steps[:, None] - steps[None, :]).float()  # [n, n]: token j's age at token i
        run = torch.where(ages >= 0, DECAY**ages, 0.0) @ x.float()  # [n, HIDDEN]
        if self.states is None:
            return run
        run = run + DECAY ** (steps[:, None] + 1.0) * self.states[0][slot].float()
        self.states[0][slot] = run[-1].to(self.states[0].dtype)
        if len(self.states) > 1:
            self.states[1][slot] += x.size(0)
        return run


class WithRecurrentLayers(nn.Module):
    """`inner` (a model of nanovllm) followed by one DecayingSum per entry of RECURRENT_SPECS, each adding its
    output to the hidden states."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.recurrent = nn.ModuleList(DecayingSum() for _ in RECURRENT_SPECS)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.inner(input_ids, positions)
        for layer in self.recurrent:
            hidden_states = hidden_states + layer(hidden_states)
        return hidden_states

    def compute_logits(self, hidden_states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner.lm_head.gather(self.compute_local_logits(hidden_states, out))

    def compute_local_logits(self, hidden_states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner.compute_local_logits(hidden_states, out)


def with_recurrent_layers(monkeypatch) -> None:
    """Engines built from here on in the test run the tiny model with the recurrent layers of RECURRENT_SPECS."""
    monkeypatch.setattr(
        config_module,
        "cache_layout",
        lambda specs, full_attention_only=False: cache_layout((*specs, *RECURRENT_SPECS), full_attention_only),
    )
    build_model = model_runner.build_model
    monkeypatch.setattr(model_runner, "build_model", lambda *args: WithRecurrentLayers(build_model(*args)))
