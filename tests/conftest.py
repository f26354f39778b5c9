"""Fixtures: tiny random models saved with transformers, with a small word-level tokenizer,
and a folder with the Qwen3-0.6B shape for dummy weights."""

import contextlib
import functools
import itertools
import json
import os
import time

import torch

# Without a GPU the Triton kernels run in Triton's interpreter. It must be chosen
# before triton is first imported (transformers imports it), hence before the rest.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from nanovllm.default_model import default_model_dir  # noqa: E402

VOCAB_SIZE = 512
EOS_ID = 1


def save_tiny_tokenizer(path) -> None:
    """A word-level tokenizer: '<unk>', '<eos>', then 'w2' ... 'w511'."""
    vocab = {"<unk>": 0, "<eos>": EOS_ID, **{f"w{i}": i for i in range(2, VOCAB_SIZE)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    tokenizer.save_pretrained(path)


def _common_config(max_positions: int = 1024) -> dict:
    # A large init spread makes the logits peaked, so greedy choices are not
    # near-ties that fp32 rounding differences could flip.
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_positions,
        initializer_range=0.1,
        eos_token_id=EOS_ID,
        bos_token_id=None,
        pad_token_id=None,
    )


def save_tiny_model(path, arch: str = "qwen3", tie: bool = False, seed: int = 0) -> None:
    """Save a random-init tiny model of `arch` ('qwen3' or 'llama') in fp32 with its tokenizer."""
    torch.manual_seed(seed)
    if arch == "qwen3":
        config = Qwen3Config(
            **_common_config(), tie_word_embeddings=tie, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
        )
        model = Qwen3ForCausalLM(config)
    else:
        config = LlamaConfig(
            **_common_config(),
            tie_word_embeddings=tie,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        )
        model = LlamaForCausalLM(config)
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    save_tiny_model(path, "qwen3")
    return str(path)


# The template's generation prompt is the word 'w3'.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('the assistant cannot speak first') }}"
    "{% endif %}{% for m in messages %}{{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}w3{% endif %}{% if shout %} w4{% endif %}"
)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory):
    """The tiny Qwen3 model, with a chat template its word-level tokenizer can encode: messages joined by
    spaces, then 'w3' as the generation prompt (and ' w4' when the template variable `shout` is set)."""
    path = tmp_path_factory.mktemp("tiny-qwen3-chat")
    save_tiny_model(path, "qwen3")
    config = path / "tokenizer_config.json"
    tokenizer_config = json.loads(config.read_text())
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    config.write_text(json.dumps(tokenizer_config))
    return str(path)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model(path, "llama", tie=True)
    return str(path)


def run_core_with_step_hook(seconds: float, failing_call: int | None, *args) -> None:
    """Entry point of a spawned engine-core process whose steps each sleep `seconds` first, as on a
    real model, so a test can act mid-generation, and whose `failing_call`-th step (from 1) raises,
    as a device failure would."""
    from nanovllm.engine import core_process
    from nanovllm.engine.engine_core import EngineCore

    real_step, calls = EngineCore.step, itertools.count(1)

    def step(self):
        if next(calls) == failing_call:
            raise RuntimeError("simulated failure")
        time.sleep(seconds)
        return real_step(self)

    EngineCore.step = step
    core_process.run_engine_core(*args)


def child_processes(pid: int) -> list[int]:
    """The processes `pid` started, but Python's multiprocessing resource tracker, which every
    program that spawns processes has (it ends with its parent)."""
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and b"resource_tracker" not in command:
            children.append(int(entry))
    return children


@contextlib.contextmanager
def core_steps(seconds: float = 0.005, failing_call: int | None = None):
    """Online engines started inside this block run their core with slowed (and maybe one failing) steps."""
    from nanovllm.engine import core_client

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core_client, "run_engine_core", functools.partial(run_core_with_step_hook, seconds, failing_call))
        yield


@pytest.fixture(scope="session")
def smollm_dir():
    """The bundled SmolLM2-135M-Instruct folder (converted once)."""
    return default_model_dir()


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_dir):
    """A byte-level BPE tokenizer: multi-byte characters span several tokens."""
    return AutoTokenizer.from_pretrained(smollm_dir)


@pytest.fixture(scope="session")
def tiny_tokenizer(qwen3_dir):
    return AutoTokenizer.from_pretrained(qwen3_dir)


@pytest.fixture(scope="session")
def qwen3_06b_shape_dir(tmp_path_factory):
    """config.json of the Qwen3-0.6B shape with a stand-in tokenizer, for dummy weights."""
    path = tmp_path_factory.mktemp("qwen3-0.6b-shape")
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "attention_bias": False,
        "eos_token_id": 1,
    }
    (path / "config.json").write_text(json.dumps(config))
    save_tiny_tokenizer(path)
    return str(path)


def run_steps(llm, outputs: dict, steps: int | None = None) -> dict:
    """Step `llm` (`steps` times, or until no request is left), keeping each request's latest
    RequestOutput in `outputs` by request id; returns `outputs`."""
    done = 0
    while llm.has_unfinished_requests() and (steps is None or done < steps):
        for output in llm.step():
            outputs[output.request_id] = output
        done += 1
    return outputs


def completions_of(outputs: dict, request_ids: list[str]) -> list:
    """The first completion of each request, in the order of `request_ids`."""
    return [outputs[request_id].outputs[0] for request_id in request_ids]


# Two greedy computations that round differently in bf16 may pick different tokens only where
# the reference's two best logits are this close: bf16 keeps 8 significant bits, so logits
# near 2 are stored in steps of 1/64, and about 5% of the tiny models' bf16 steps are exact ties.
NEAR_TIE = 1 / 16


def gaps_where_greedy_diverges(completions: list, references: list) -> list[float]:
    """For each completion that leaves its reference's tokens, the gap between the reference's two
    best logprobs at the first differing token (both generated with logprobs >= 2)."""
    gaps = []
    for completion, reference in zip(completions, references):
        pairs = zip(completion.token_ids, reference.token_ids)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if first is not None:
            best = sorted((lp.logprob for lp in reference.logprobs[first].values()), reverse=True)
            gaps.append(best[0] - best[1])
    return gaps
