"""Engine configuration: one validated dataclass built from `LLM(model, **kwargs)`.

torch and transformers are imported inside the methods that use them, so that
`nanovllm serve --help` builds its flags from these fields without loading them.
"""

import importlib.util
import json
import math
import os
import types
import typing
import warnings
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from nanovllm.cache.layout import CacheLayout, cache_layout
from nanovllm.spec_decode.mtp_config import with_mtp
from nanovllm.spec_decode.speculative_config import SpeculativeConfig

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from nanovllm.models.model_config import ModelConfig
    from nanovllm.models.quantization_config import Fp8Weights

_LOAD_FORMATS = ("auto", "dummy")
_ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")
_KV_CACHE_DTYPES = ("auto", "fp8")
_QUANTIZATIONS = ("auto", "fp8")
_DEVICES = ("auto", "cuda", "cpu")
# vLLM's names: "half" is float16 and "float" float32
_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "True or False", str: "a string", dict: "a dict"}
_DEFAULT_MAX_MODEL_LEN = 4096
# Tokens per step when max_num_batched_tokens=-1. A GPU step of 16k tokens keeps
# the chip busy. On the CPU a step's time grows with its tokens: small chunks keep
# running streams from waiting long while a long prompt is absorbed, and larger
# ones absorb it no faster (benchmarks/cpu_serving_stall.py).
_DEFAULT_TOKEN_BUDGET = {"cuda": 16384, "cpu": 256}
_SEED_MIN, _SEED_MAX = -(1 << 63), (1 << 63) - 1


def _has_type(value, expected) -> bool:
    """Whether `value` fits a field annotated `expected`: bools only fit bool, ints also fit float, and
    None fits `X | None`."""
    if isinstance(expected, types.UnionType):
        return any(_has_type(value, member) for member in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


def _type_name(expected) -> str:
    """How an error names the type of a field annotated `expected` (`X | None` by X's name)."""
    if isinstance(expected, types.UnionType):
        return _TYPE_NAMES[next(member for member in typing.get_args(expected) if member is not type(None))]
    return _TYPE_NAMES[expected]


def json_object(text: str) -> dict:
    """A command-line JSON object as a dict; ValueError (which argparse reports) for anything else."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


def _option(default, help: str, **flag):
    """A Config field with its default, the line `nanovllm serve --help` shows for it and, in `flag`, what
    argparse needs beyond them."""
    return field(default=default, metadata={"help": help, **flag})


@dataclass
class Config:
    """Everything the engine needs to know, checked once at construction.

    `model` is a local Hugging Face folder (config.json, *.safetensors, tokenizer
    files), as a string or a path object. `max_model_len=-1` (the default)
    means the model's `max_position_embeddings`, at most 4096; a value above
    the model's is refused. `block_size=None` (or -1) means the device's
    default block size; the size in use is `kv_block_size`. `dtype` takes
    vLLM's names ("half" is float16, "float" float32). `num_kvcache_blocks=-1` means "size the KV cache
    from memory": from `gpu_memory_utilization` on CUDA, from `cpu_kvcache_gb`
    on CPU (which must leave 10% of the available memory free).
    `attention_backend="auto"` picks the Triton kernels on CUDA and PyTorch on
    the CPU; "flash_attn" uses the flash-attn package if it is installed.
    `tensor_parallel_size=N` splits the model over N ranks (one GPU each on
    CUDA, N processes on CPU) that meet at `master_addr` ($MASTER_ADDR when empty, default 127.0.0.1) on
    `master_port` ($MASTER_PORT when 0 and set, else a free port). With `nnodes=M` the ranks are spread over
    M machines, N / M each: node `node_rank` runs global ranks node_rank * N / M onwards, rank r on local GPU
    r mod N / M; node 0 runs the engine and the others only their ranks (`nanovllm serve --headless`), and
    every node names node 0's address and a fixed port.
    `data_parallel_size=D` runs D engine replicas, each with its own core process and KV cache (and its own
    `tensor_parallel_size` ranks), behind one server (`OnlineEngine`), on one machine.
    `kv_cache_dtype="fp8"` stores K/V as float8 (e4m3) with one fp32 scale per
    token and KV head, about half the bytes of a bf16 cache: twice the tokens
    fit, and decode reads half as much; "auto" stores them in the model's dtype.
    `quantization="fp8"` stores every linear layer's weight of the decoder (attention's qkv and o, the
    MLP's gate_up and down; not the embeddings, the norms or the LM head) as float8 (e4m3) with one
    fp32 scale per output channel, quantized at load, and quantizes activations per token on the fly;
    "auto" keeps the checkpoint's weights as they are: full precision, or FP8 for an FP8 checkpoint
    (`models/quantization_config.py` lists the layouts that load). Mixture-of-experts models are refused.
    gpt-oss's MXFP4 checkpoints load with "auto": their experts stay MXFP4, 4.25 bits a weight.
    `skip_tokenizer_init=True` loads no tokenizer: prompts must be token ids
    and outputs have empty text.
    `enable_chunked_prefill=True` splits prompts into chunks that fit
    `max_num_batched_tokens` and runs them in the same steps as the running
    sequences' decodes, so `max_model_len` may exceed the token budget; when
    False a prompt is prefilled whole, in a step of its own.
    `max_num_batched_tokens=-1` (the default) means the device's budget: 16384
    tokens per step on CUDA, 256 on the CPU (where a step's time grows with its
    tokens and decoding streams wait for it); with chunked prefill off, at least
    `max_model_len`.
    `enable_prefix_caching=False` turns the prefix cache off: no prompt reads
    the K/V of blocks computed for another, and no block is registered for it.
    `device="auto"` (the default) is "cuda" when a GPU is visible, else "cpu".
    `generation_config="auto"` takes the sampling values of the model folder's
    generation_config.json (temperature, top_p, top_k, min_p,
    repetition_penalty) as the defaults of requests that leave them out, as
    vLLM does; "vllm" keeps the engine's own defaults; a folder path reads that
    folder's file instead.
    `speculative_config` (vLLM's dict; `spec_decode/speculative_config.py` lists the keys) makes requests
    propose tokens that the model checks several at a time; with method "draft_model" its 'model' folder
    is checked here as a model of its own (`draft_config`), with the target's vocabulary size.
    `trust_remote_code` is accepted as vLLM accepts it and changes nothing (a
    warning says so when it is True): only built-in architectures load.
    Each field's one-line help (its metadata) is what `nanovllm serve --help` shows.
    """

    model: str
    max_num_batched_tokens: int = _option(
        -1,
        "most tokens one step computes, prompt chunks and decodes together; -1: 16384 on CUDA, 256 on the "
        "CPU (with chunked prefill off, at least max_model_len)",
    )
    max_num_seqs: int = _option(512, "most sequences one step runs")
    max_model_len: int = _option(
        -1, "longest sequence (prompt plus completion) in tokens; -1: the model's max_position_embeddings, at most 4096"
    )
    enable_chunked_prefill: bool = _option(
        True,
        "split long prompts into chunks that run beside the decodes; off: each prompt is prefilled whole, "
        "in a step of its own",
    )
    enable_prefix_caching: bool = _option(
        True, "reuse the KV blocks of a prompt prefix computed before; off: every prompt is computed in full"
    )
    schedule_conservativeness: float = _option(
        1.0,
        "how much room admission keeps for running requests to decode into: this times the share of their "
        "max_tokens (at most 4096) that finished requests wrote; 0: none, admit while prompts fit and preempt "
        "when blocks run out",
    )
    gpu_memory_utilization: float = _option(
        0.9, "share of the GPU's memory the engine may take, KV cache included (with num_kvcache_blocks=-1)"
    )
    tensor_parallel_size: int = _option(1, "split the model over this many GPUs (processes on the CPU)")
    enforce_eager: bool = _option(False, "run decode steps eagerly instead of replaying CUDA graphs")
    block_size: int | None = _option(
        None,
        "tokens per KV-cache block, a power of two >= 16, and the prefix cache's unit (a prompt shares only whole "
        "blocks with an earlier one); unset or -1: 16 (256 with attention_backend='flash_attn')",
        type=int,
    )
    kv_cache_dtype: str = _option(
        "auto",
        "'auto': K/V in the model's dtype; 'fp8': float8 (e4m3) with a scale per token and KV head, "
        "about half the memory",
    )
    quantization: str = _option(
        "auto",
        "'fp8': linear weights in float8 (e4m3) with a scale per output channel, quantized at load; "
        "'auto': as the checkpoint stores them (FP8 checkpoints load as FP8)",
    )
    num_kvcache_blocks: int = _option(
        -1, "KV-cache blocks; -1: as many as memory holds (gpu_memory_utilization on CUDA, cpu_kvcache_gb on the CPU)"
    )
    cpu_kvcache_gb: float = _option(2.0, "GiB of KV cache on the CPU (with num_kvcache_blocks=-1)")
    disable_hybrid_kv_cache_manager: bool = _option(
        False,
        "keep every token of a sliding-window layer in the KV cache too, as for full attention (to measure what "
        "freeing the blocks behind the window saves)",
    )
    device: str = _option("auto", "'cuda', 'cpu', or 'auto': cuda when a GPU is visible, else cpu")
    dtype: str = _option(
        "auto",
        "dtype of weights and activations: 'float32' (or 'float'), 'bfloat16', 'float16' (or 'half'), or 'auto': "
        "the checkpoint's",
    )
    load_format: str = _option(
        "auto", "'auto': the folder's safetensors weights; 'dummy': random weights of the right shapes"
    )
    attention_backend: str = _option(
        "auto", "'triton', 'torch', 'flash_attn', or 'auto': triton on CUDA, torch on the CPU"
    )
    skip_tokenizer_init: bool = _option(False, "load no tokenizer: prompts must be token ids, and outputs have no text")
    trust_remote_code: bool = _option(
        False,
        "accepted for vLLM compatibility; changes nothing: only built-in architectures load, and no "
        "code from the model folder runs",
    )
    generation_config: str = _option(
        "auto",
        "sampling defaults for requests that leave them out: 'auto': the model folder's generation_config.json; "
        "'vllm': none, the engine's own; or a folder that holds a generation_config.json",
    )
    seed: int = _option(0, "seed of the engine's random numbers: dummy weights, and draws of requests without a seed")
    master_port: int = _option(
        0,
        "port where tensor-parallel ranks meet (on node 0 with nnodes > 1); 0: $MASTER_PORT if set, else a free "
        "port (one node only)",
    )
    master_addr: str = _option(
        "", "address where tensor-parallel ranks meet: node 0's with nnodes > 1; empty: $MASTER_ADDR, else 127.0.0.1"
    )
    nnodes: int = _option(1, "machines the tensor-parallel ranks are spread over, tensor_parallel_size / nnodes each")
    node_rank: int = _option(
        0, "which of the nnodes machines this is: 0 runs the engine, the others run their ranks headless"
    )
    data_parallel_size: int = _option(
        1, "independent engine replicas (each its own KV cache and core process) behind one server, on one machine"
    )
    data_parallel_rank: int = _option(
        0,
        "which replica this engine is, of data_parallel_size: its ranks run on GPUs data_parallel_rank * "
        "tensor_parallel_size onwards (the server sets it for each replica it starts)",
    )
    speculative_config: dict | None = _option(
        None,
        'speculative decoding as vLLM takes it, e.g. \'{"method": "ngram", "num_speculative_tokens": 3, '
        '"prompt_lookup_max": 4}\' (default: none)',
        type=json_object,
        metavar="JSON",
    )
    hf_config: "PretrainedConfig" = field(init=False, repr=False)
    # what the engine reads of hf_config, read once (nothing else reads hf_config)
    model_config: "ModelConfig" = field(init=False, repr=False)
    # What construction derives from the fields above, each its own value (the fields stay as given):
    device_type: str = field(init=False)  # "cuda" or "cpu" (device "auto" resolved)
    attention_impl: str = field(init=False)  # "triton", "torch" or "flash_attn" (attention_backend resolved)
    context_len: int = field(init=False)  # max_model_len resolved: the longest sequence in tokens
    token_budget: int = field(init=False)  # max_num_batched_tokens resolved: the most tokens per step
    kv_block_size: int = field(init=False)  # block_size resolved: tokens per KV-cache block
    kv_layout: CacheLayout = field(init=False, repr=False)  # the paged layers' cache groups (`cache/layout.py`)
    # the linear weights' FP8 layout: the checkpoint's, else per channel with quantization="fp8"; None: none
    fp8_weights: "Fp8Weights | None" = field(init=False)
    speculative: SpeculativeConfig | None = field(init=False)  # speculative_config read; None: no speculation
    # with method "draft_model": the draft model's runner's Config (see `_resolve_draft_config`); else None
    draft_config: "Config | None" = field(init=False, repr=False)
    ranks_per_node: int = field(init=False)  # tensor_parallel_size / nnodes: the ranks (and GPUs) of each node

    @classmethod
    def from_kwargs(cls, model: str, **kwargs) -> "Config":
        """Build a Config, naming any keyword that is not one of its fields."""
        known = {f.name for f in fields(cls) if f.init} - {"model"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown argument(s) {', '.join(unknown)}; valid ones are: {', '.join(sorted(known))}")
        return cls(model=model, **kwargs)

    def __post_init__(self) -> None:
        if isinstance(self.model, os.PathLike):
            self.model = os.fspath(self.model)
        self._check_types()
        self._check_ranges()
        self._check_nodes()
        self.ranks_per_node = self.tensor_parallel_size // self.nnodes
        self.speculative = (
            None if self.speculative_config is None else SpeculativeConfig.from_dict(self.speculative_config)
        )
        self.device_type = self._resolve_device()
        self.kv_block_size = self._resolve_block_size()
        self.attention_impl = self._resolve_attention_backend()
        self._check_kv_cache_dtype()
        self._check_model_folder()
        self._check_generation_config()
        if self.trust_remote_code:
            warnings.warn(
                "trust_remote_code=True changes nothing: nanovllm loads only its built-in architectures "
                "and runs no code from the model folder",
                stacklevel=3,
            )
        self.hf_config, self.model_config = self._load_model_config()
        if self.speculative is not None and self.speculative.method == "mtp":
            self.model_config = with_mtp(self.model_config, self.model, self.load_format, self.tensor_parallel_size)
        self.context_len = self._resolve_max_model_len()
        self.kv_layout = cache_layout(self.model_config.cache_specs, self.disable_hybrid_kv_cache_manager)
        self._check_attention_features()
        self.fp8_weights = self._resolve_fp8_weights()
        self.token_budget = self._resolve_token_budget()
        if not self.enable_chunked_prefill and self.token_budget < self.context_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.token_budget}) must be at least "
                f"max_model_len ({self.context_len}), or a long prompt could never be scheduled; "
                f"raise max_num_batched_tokens, lower max_model_len or set enable_chunked_prefill=True"
            )
        self.draft_config = self._resolve_draft_config()

    @property
    def kv_lookback(self) -> int:
        """Positions a step may move back by once it is launched: the drafts of the step before it, which the
        host scheduled it behind as if all were kept. A sliding-window group keeps that many more tokens."""
        return self.speculative.num_speculative_tokens if self.speculative is not None else 0

    @property
    def max_blocks_per_seq(self) -> int:
        """KV blocks a sequence at `context_len` tokens holds."""
        return (self.context_len + self.kv_block_size - 1) // self.kv_block_size

    @property
    def torch_dtype(self) -> "torch.dtype":
        """The dtype weights and activations use: the checkpoint's unless `dtype` overrides it."""
        import torch

        if self.dtype != "auto":
            return getattr(torch, self.dtype)
        return getattr(torch, self.model_config.dtype or "float32")

    def _check_types(self) -> None:
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if not _has_type(value, f.type):
                raise ValueError(f"{f.name} must be {_type_name(f.type)}, got {value!r} ({type(value).__name__})")

    def _check_ranges(self) -> None:
        def require(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        require(
            self.max_num_batched_tokens == -1 or self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, or -1 for the device's default, got {self.max_num_batched_tokens}",
        )
        require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        require(
            self.max_model_len == -1 or self.max_model_len >= 1,
            f"max_model_len must be >= 1, or -1 for the model's limit (at most {_DEFAULT_MAX_MODEL_LEN}), "
            f"got {self.max_model_len}",
        )
        require(
            0.0 < self.gpu_memory_utilization <= 1.0,
            f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        require(
            0.0 <= self.schedule_conservativeness and math.isfinite(self.schedule_conservativeness),
            f"schedule_conservativeness must be a finite number >= 0, got {self.schedule_conservativeness}",
        )
        require(self.tensor_parallel_size >= 1, f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        require(
            0 <= self.master_port < 65536,
            f"master_port must be in [0, 65535] (0 = pick a free one), got {self.master_port}",
        )
        bs = self.block_size
        require(
            bs in (None, -1) or (bs >= 16 and bs & (bs - 1) == 0),
            f"block_size must be a power of two >= 16 (or None / -1 for the device's default), got {bs}",
        )
        require(
            self.num_kvcache_blocks == -1 or self.num_kvcache_blocks >= 1,
            f"num_kvcache_blocks must be -1 (size from memory) or >= 1, got {self.num_kvcache_blocks}",
        )
        require(
            self.cpu_kvcache_gb > 0 and math.isfinite(self.cpu_kvcache_gb),
            f"cpu_kvcache_gb must be a finite number > 0, got {self.cpu_kvcache_gb}",
        )
        require(
            _SEED_MIN <= self.seed <= _SEED_MAX,
            f"seed must be in [-2**63, 2**63 - 1] (a signed 64-bit integer), got {self.seed}",
        )
        require(self.device in _DEVICES, f"device must be one of {', '.join(_DEVICES)}, got {self.device!r}")
        require(self.dtype in _DTYPES, f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        require(
            self.load_format in _LOAD_FORMATS,
            f"load_format must be one of {', '.join(_LOAD_FORMATS)}, got {self.load_format!r}",
        )

    def _check_nodes(self) -> None:
        """The nodes, ranks and replicas fit together: ValueError naming what to change."""
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, nnodes - 1] = [0, {self.nnodes - 1}], got {self.node_rank}")
        if self.tensor_parallel_size % self.nnodes:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} must be divisible by nnodes={self.nnodes} "
                "(every node runs as many ranks); change one of them"
            )
        if self.nnodes > 1 and not (self.master_port or os.environ.get("MASTER_PORT")):
            raise ValueError(
                "nnodes > 1 needs a fixed master_port (or $MASTER_PORT) that every node names: the port on node 0 "
                "where the ranks meet"
            )
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {self.data_parallel_size}")
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ValueError(
                f"data_parallel_rank must be in [0, data_parallel_size - 1] = [0, {self.data_parallel_size - 1}], "
                f"got {self.data_parallel_rank}"
            )
        if self.data_parallel_size > 1 and self.nnodes > 1:
            raise ValueError(
                "data_parallel_size > 1 runs its replicas on one machine; use nnodes=1 with it, or run one server "
                "per group of nodes behind a router (docs/multi-node.md)"
            )

    def rank_range(self) -> range:
        """The global tensor-parallel ranks this node runs."""
        return range(self.node_rank * self.ranks_per_node, (self.node_rank + 1) * self.ranks_per_node)

    def device_index(self, rank: int) -> int:
        """The GPU of its machine that global rank `rank` runs on: past the GPUs of the replicas before this
        one, its index among the ranks of its node."""
        return self.data_parallel_rank * self.ranks_per_node + rank % self.ranks_per_node

    def _resolve_device(self) -> str:
        """'auto' as 'cuda' when a GPU is visible, else 'cpu'; a CUDA device must have a GPU per rank."""
        import torch

        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            return "cpu"
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for but no CUDA GPU is visible; use device='cpu'")
        num_gpus = torch.cuda.device_count()
        needed = self.ranks_per_node * self.data_parallel_size
        if num_gpus < needed:
            nodes = f" over nnodes={self.nnodes}" if self.nnodes > 1 else ""
            replicas = (
                f" in each of data_parallel_size={self.data_parallel_size} replicas"
                if self.data_parallel_size > 1
                else ""
            )
            here = f" ({needed} on this machine)" if needed != self.tensor_parallel_size else ""
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size}{nodes}{replicas} needs one GPU per rank{here} but "
                f"{num_gpus} {'is' if num_gpus == 1 else 'are'} visible; lower tensor_parallel_size or "
                f"data_parallel_size, raise nnodes, or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
            )
        return "cuda"

    def _load_model_config(self) -> tuple["PretrainedConfig", "ModelConfig"]:
        """The folder's config.json and the ModelConfig read from it, once the engine is known to run it
        and its heads and vocabulary to split over the ranks."""
        from transformers import AutoConfig

        from nanovllm.models.model_config import ModelConfig
        from nanovllm.utils.parallel import check_divisible

        hf_config = AutoConfig.from_pretrained(self.model)
        model_config = ModelConfig.from_hf(hf_config)
        check_divisible(model_config, self.tensor_parallel_size)
        return hf_config, model_config

    def _check_kv_cache_dtype(self) -> None:
        if self.kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(_KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}"
            )
        if self.kv_cache_dtype != "fp8":
            return
        if self.attention_impl == "flash_attn":
            raise ValueError(
                "kv_cache_dtype='fp8' needs attention_backend 'triton' or 'torch' (flash-attn reads "
                "only full-precision caches); change one of them"
            )
        import torch

        if self.device_type == "cuda" and torch.cuda.get_device_capability() < (8, 9):
            major, minor = torch.cuda.get_device_capability()
            raise ValueError(
                f"kv_cache_dtype='fp8' needs a GPU that converts to float8 (compute capability 8.9 "
                f"or newer, e.g. L4, H100); this one is {major}.{minor}: use kv_cache_dtype='auto'"
            )

    def _resolve_fp8_weights(self) -> "Fp8Weights | None":
        """The FP8 layout of the linear weights: an FP8 checkpoint's own (quantization "fp8" or "auto"), else
        per output channel when quantization="fp8", else None."""
        from nanovllm.models.quantization_config import Fp8Weights

        if self.quantization not in _QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(_QUANTIZATIONS)}, got {self.quantization!r}")
        fp8 = self.model_config.weight_quantization
        if fp8 is None and self.quantization == "fp8":
            fp8 = Fp8Weights()
        if fp8 is not None and self.model_config.num_experts:
            raise ValueError(
                "FP8 weights are not supported for mixture-of-experts models yet (their experts stay full "
                "precision); use a full-precision checkpoint with quantization='auto'"
            )
        if fp8 is not None and self.device_type == "cuda":
            import torch

            if torch.cuda.get_device_capability() < (8, 9):
                major, minor = torch.cuda.get_device_capability()
                raise ValueError(
                    f"FP8 weights need a GPU with FP8 tensor cores (compute capability 8.9 or newer, e.g. L4, "
                    f"H100); this one is {major}.{minor}: use a full-precision checkpoint without quantization='fp8'"
                )
        return fp8

    def _resolve_max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        if self.max_model_len == -1:
            return min(_DEFAULT_MAX_MODEL_LEN, limit)
        if self.max_model_len > limit:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's limit of {limit} tokens "
                f"(max_position_embeddings in config.json); max_model_len must not exceed {limit}: "
                f"lower it, or leave it out (-1) for {min(_DEFAULT_MAX_MODEL_LEN, limit)}"
            )
        return self.max_model_len

    def _resolve_block_size(self) -> int:
        if self.block_size not in (None, -1):
            return self.block_size
        # small blocks let chats share their prefixes; flash-attn's paged layout needs 256
        return 256 if self.attention_backend == "flash_attn" else 16

    def _resolve_token_budget(self) -> int:
        if self.max_num_batched_tokens != -1:
            return self.max_num_batched_tokens
        budget = _DEFAULT_TOKEN_BUDGET[self.device_type]
        return budget if self.enable_chunked_prefill else max(budget, self.context_len)

    def _resolve_attention_backend(self) -> str:
        name = self.attention_backend
        if name not in _ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(_ATTENTION_BACKENDS)}, got {name!r}")
        if name == "auto":
            return "triton" if self.device_type == "cuda" else "torch"
        if name == "triton" and self.device_type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "attention_backend='triton' needs device='cuda' (or TRITON_INTERPRET=1 on the CPU, "
                "which is slow and meant for tests); use 'torch' on the CPU"
            )
        if name in ("triton", "flash_attn") and importlib.util.find_spec(name) is None:
            raise ValueError(
                f"attention_backend={name!r} needs the {name} package, which is not installed; "
                f"install it or use attention_backend='auto'"
            )
        if name == "flash_attn" and (self.device_type != "cuda" or self.kv_block_size % 256):
            raise ValueError(
                "attention_backend='flash_attn' needs device='cuda' and a block_size "
                "that is a multiple of 256 (flash-attn's paged layout)"
            )
        return name

    def _check_attention_features(self) -> None:
        """flash_attn is called without a sliding window or a soft-cap: refuse a model that needs either."""
        if self.attention_impl != "flash_attn":
            return
        model = self.model_config
        if model.attn_logit_softcapping is not None:
            raise ValueError(
                f"attention_backend='flash_attn' cannot soft-cap attention scores, which this model does "
                f"(attn_logit_softcapping {model.attn_logit_softcapping}); use attention_backend 'triton' or 'auto'"
            )
        # a window no context reaches changes nothing
        if model.sliding_window is not None and self.context_len > model.sliding_window:
            raise ValueError(
                f"attention_backend='flash_attn' cannot apply this model's sliding window of "
                f"{model.sliding_window} tokens; use attention_backend 'triton' or 'auto', or set "
                f"max_model_len <= {model.sliding_window} (it is {self.context_len}), where the window changes nothing"
            )

    def _resolve_draft_config(self) -> "Config | None":
        """With method "draft_model": the Config of the draft's runner, this one with the draft's folder, the
        same model length, one rank and no speculation of its own, checked now (its folder, its length
        limit, a vocabulary the same size as the target's); None for any other method."""
        spec = self.speculative
        if spec is None or spec.method != "draft_model":
            return None
        if self.tensor_parallel_size > 1:
            raise ValueError(
                "speculative_config method 'draft_model' runs with tensor_parallel_size=1 only (for now); "
                "lower tensor_parallel_size or use method 'ngram'"
            )
        try:
            # the draft's own generation_config.json is never read: requests sample with the target's defaults
            draft = replace(
                self,
                model=spec.model,
                max_model_len=self.context_len,
                speculative_config=None,
                generation_config="vllm",
                trust_remote_code=False,
            )
        except (ValueError, FileNotFoundError) as e:
            raise type(e)(f"speculative_config 'model' (the draft model {spec.model!r}): {e}") from e
        vocab, draft_vocab = self.model_config.vocab_size, draft.model_config.vocab_size
        if draft_vocab != vocab:
            raise ValueError(
                f"speculative_config 'model' {spec.model!r} has a vocabulary of {draft_vocab} tokens but the target "
                f"model {self.model!r} has {vocab}; the draft model must share the target's tokenizer"
            )
        if draft.kv_layout.has_state:
            # the draft's runner gets no state slots: its steps carry none
            raise ValueError(
                f"speculative_config 'model' {spec.model!r} ({draft.model_config.architecture}) has recurrent "
                "layers, which method 'draft_model' cannot run as a draft; use a draft model of attention layers "
                "only, or method 'ngram'"
            )
        return draft

    def _check_generation_config(self) -> None:
        if self.generation_config in ("auto", "vllm"):
            return
        if not os.path.isfile(os.path.join(self.generation_config, "generation_config.json")):
            raise FileNotFoundError(
                f"generation_config={self.generation_config!r} is neither 'auto', 'vllm' nor a folder that holds "
                f"a generation_config.json"
            )

    def _check_model_folder(self) -> None:
        if not os.path.isdir(self.model):
            raise FileNotFoundError(
                f"model folder {self.model!r} does not exist; pass a local Hugging Face model folder"
            )
        if not os.path.isfile(os.path.join(self.model, "config.json")):
            raise FileNotFoundError(f"no config.json in {self.model!r}; is this a Hugging Face model folder?")
