"""The public entry point."""

from nanovllm.engine.llm_engine import LLMEngine


class LLM(LLMEngine):
    """Offline batched generation: `LLM(model_dir, **config).generate(prompts, params)`."""
