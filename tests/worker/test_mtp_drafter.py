"""The drafts of method "mtp" against a direct computation of the multi-token-prediction layer from the saved
weights: transformers' own decoder layer (loaded from the checkpoint's mtp.layers.0) over the layer's inputs,
fc of the normed embedding of the next token beside the normed hidden state that transformers' decoder gives
each position, the norms scaling by 1 + weight. Verification would hide a wrong draft (it only costs speed), so
each draft the runner made is checked here, for whole prompts, prompts in small chunks and drafts past rejected
ones, on the dense Qwen3.5 and on Qwen3-Next (experts beside a shared expert)."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from nanovllm import SamplingParams

from helpers.engine_probes import engine
from helpers.mtp_layers import MTP_FILE
from helpers.prompts import repetitive_prompts
from helpers.qwen3_5_models import save_qwen3_5
from helpers.qwen3_next_models import save_qwen3_next

K = 3
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's RMSNorm: x / rms(x) times (1 + weight)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + weight)


class ReferenceMTP:
    """The MTP layer of the checkpoint in `model_dir`, computed with transformers' decoder and decoder layer."""

    def __init__(self, model_dir: str):
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
        config = self.model.config
        self.eps = config.rms_norm_eps
        weights = load_file(os.path.join(model_dir, MTP_FILE))
        self.fc, self.norm = weights["mtp.fc.weight"], weights["mtp.norm.weight"]
        self.norm_embedding, self.norm_hidden = (
            weights["mtp.pre_fc_norm_embedding.weight"],
            weights["mtp.pre_fc_norm_hidden.weight"],
        )
        layer_types = json.loads(open(os.path.join(model_dir, "config.json")).read())["layer_types"]
        full = max(i for i, kind in enumerate(layer_types) if kind == "full_attention")  # the copied layer's kind
        self.layer = type(self.model.model.layers[full])(config, full).eval()
        prefix = "mtp.layers.0."
        self.layer.load_state_dict(
            _stacked_experts({k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)})
        )

    @torch.inference_mode()
    def drafts(self, sequence: list[int], k: int) -> list[int]:
        """The k tokens the layer drafts greedily after `sequence`: at every position t before the last, from
        token t + 1 and the decoder's hidden state at t; then on from each draft and the layer's own output."""
        ids = torch.tensor(sequence)
        hidden = self.model.model(ids[None]).last_hidden_state[0, :-1]  # [n - 1, hidden], after the final norm
        next_ids, drafts = ids[1:], []
        for _ in range(k):
            out = self._layer_outputs(next_ids, hidden)
            drafts.append(int(self.model.lm_head(out[-1]).argmax()))
            next_ids, hidden = torch.cat([next_ids, torch.tensor(drafts[-1:])]), torch.cat([hidden, out[-1:]])
        return drafts

    def _layer_outputs(self, next_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's normed output at positions 0 .. n - 1, each attending causally to those before it."""
        embeddings = self.model.model.embed_tokens(next_ids)
        x = torch.cat(
            [_rms_norm(embeddings, self.norm_embedding, self.eps), _rms_norm(hidden, self.norm_hidden, self.eps)], -1
        )
        x = (x @ self.fc.T)[None]  # [1, n, hidden]
        n = x.size(1)
        positions = torch.arange(n)[None]
        # Qwen3.5's rotary takes a row of positions per multimodal section (text: three alike)
        rotary_positions = (
            positions.expand(3, 1, n) if self.model.config.model_type.startswith("qwen3_5") else positions
        )
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        rotary = self.model.model.rotary_emb(x, rotary_positions)
        out = self.layer(x, rotary, attention_mask=mask, position_ids=positions)
        out = out[0] if isinstance(out, tuple) else out
        return _rms_norm(out[0], self.norm, self.eps)


def _stacked_experts(weights: dict) -> dict:
    """A layer's tensors with one-tensor-per-expert projections (as transformers saves Qwen3-Next's) stacked as
    its module holds them: experts.gate_up_proj [experts, 2 * width, hidden] and experts.down_proj."""
    ones = sorted(
        int(k.split(".")[2]) for k in weights if k.startswith("mlp.experts.") and k.endswith("gate_proj.weight")
    )
    if not ones:
        return weights
    expert = lambda e, name: weights.pop(f"mlp.experts.{e}.{name}.weight")  # noqa: E731
    gate_up = [torch.cat([expert(e, "gate_proj"), expert(e, "up_proj")]) for e in ones]
    down = [expert(e, "down_proj") for e in ones]
    return {**weights, "mlp.experts.gate_up_proj": torch.stack(gate_up), "mlp.experts.down_proj": torch.stack(down)}


def record_drafts(llm) -> list[tuple[str, int, list[int]]]:
    """A list that fills with (request id, its tokens then, the drafts after them) as the drafts come back."""
    proposer, received = llm.client.core.scheduler.proposer, []
    receive = proposer.receive

    def recording(request_id, num_tokens, drafts):
        received.append((request_id, num_tokens, list(drafts)))
        receive(request_id, num_tokens, drafts)

    proposer.receive = recording
    return received


@pytest.fixture(scope="module", params=[save_qwen3_5, save_qwen3_next], ids=["qwen3_5", "qwen3_next"])
def model_dir(request, tmp_path_factory):
    return request.param(tmp_path_factory.mktemp(request.param.__name__))


@pytest.mark.parametrize("chunk", [None, 8], ids=["whole-prompts", "chunks-of-8"])
def test_every_draft_is_the_mtp_layers_greedy_guess(model_dir, chunk):
    prompts = repetitive_prompts([5, 13, 30], seed=2)
    kwargs = {} if chunk is None else {"max_num_batched_tokens": chunk, "max_num_seqs": 2}
    llm = engine(model_dir, speculative_config={"method": "mtp", "num_speculative_tokens": K}, **kwargs)
    received = record_drafts(llm)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    sequences = {out.request_id: prompt + out.outputs[0].token_ids for prompt, out in zip(prompts, outputs)}
    reference = ReferenceMTP(model_dir)
    assert len(received) >= len(prompts) * 3
    for request_id, num_tokens, drafts in received:
        assert drafts == reference.drafts(sequences[request_id][:num_tokens], K), (request_id, num_tokens)
