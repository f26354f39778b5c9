"""The executor a config asks for: tensor-parallel ranks when tensor_parallel_size > 1, else one runner."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanovllm.config import Config
    from nanovllm.worker.executor import Executor


def make_executor(config: "Config", eos_token_ids: tuple[int, ...]) -> "Executor":
    """The executor `config` asks for, built now (the model loaded, the KV cache sized)."""
    # the runners import torch, which the engine package loads only once a core starts
    if config.tensor_parallel_size > 1:
        from nanovllm.worker.tensor_parallel import TensorParallelRunner

        return TensorParallelRunner(config, eos_token_ids)
    from nanovllm.worker.model_runner import ModelRunner

    return ModelRunner(config, eos_token_ids)
