"""nanovllm: a small, readable LLM inference engine.

`LLM` is imported on first use, so that importing the package (as the
`nanovllm` command does to parse its flags) does not load torch.
"""

from importlib.metadata import PackageNotFoundError, version

from nanovllm.outputs import CompletionOutput, Logprob, RequestOutput
from nanovllm.sampling_params import SamplingParams, StructuredOutputsParams

try:
    __version__ = version("nanovllm")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput", "Logprob"]


def __getattr__(name: str):
    if name == "LLM":
        from nanovllm.llm import LLM

        return LLM
    raise AttributeError(f"module 'nanovllm' has no attribute {name!r}")
