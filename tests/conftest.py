"""Fixtures: tiny random models saved with transformers, with a small word-level tokenizer,
and a folder with the Qwen3-0.6B shape for dummy weights."""

import gc
import json
import os

import torch

# Without a GPU the Triton kernels run in Triton's interpreter. It must be chosen
# before triton is first imported (transformers imports it), hence before the rest.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # One PyTorch thread per process (this one and those it starts), unless OMP_NUM_THREADS says otherwise:
    # the tests' tensors are small, and threads that meet at every op's barrier stall whenever another
    # process holds one of the cores, which makes the tests several times slower on a busy machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

import pytest  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from nanovllm.default_model import default_model_dir  # noqa: E402

from helpers.tiny_models import save_tiny_model, save_tiny_tokenizer  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip themselves where no CUDA GPU is present."""
    if torch.cuda.is_available():
        return
    needs_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(needs_gpu)


@pytest.fixture(autouse=True)
def _gpu_memory_returned_after_each_gpu_test(request):
    """After a GPU test, its engines and tensors are freed and the memory PyTorch's allocator keeps cached goes
    back to the driver: the GPU suite runs in several processes on one GPU, and an engine sizes its KV cache from
    what the whole GPU has free. An engine a test patched with a function that refers to it lives in a reference
    cycle, which only the cycle collector frees."""
    yield
    if request.node.get_closest_marker("gpu") and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


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
    "{% if reasoning_effort %} w{{ {'low': 10, 'medium': 11, 'high': 12}[reasoning_effort] }}{% endif %}"
)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory):
    """The tiny Qwen3 model, with a chat template its word-level tokenizer can encode: messages joined by
    spaces, then 'w3' as the generation prompt (and ' w4' when the template variable `shout` is set, ' w10' to
    ' w12' for `reasoning_effort` low to high)."""
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
