"""The lines a front end logs once its engine has started: what runs, where, and what it took."""

import logging

from nanovllm.config import Config
from nanovllm.core.state_slots import SLOTS_PER_SEQUENCE
from nanovllm.engine.messages import EngineCoreInfo

logger = logging.getLogger(__name__)

_MIB = 1 << 20
_GIB = 1 << 30


def memory_size(num_bytes: int) -> str:
    """Bytes as the log shows them: GiB from 1 GiB up, MiB below."""
    return f"{num_bytes / _GIB:.2f} GiB" if num_bytes >= _GIB else f"{num_bytes / _MIB:.1f} MiB"


def _warn_of_fewer_running_states(config: Config, num_state_slots: int) -> None:
    """A warning where the state slots (one per running sequence, its live state) are fewer than max_num_seqs:
    the scheduler then runs no more sequences than there are slots."""
    if num_state_slots < config.max_num_seqs:
        setting = "gpu_memory_utilization" if config.device_type == "cuda" else "cpu_kvcache_gb"
        logger.warning(
            "the state cache holds %d recurrent-state slots, fewer than max_num_seqs=%d: at most %d sequences "
            "run at once (beyond %d, some without the snapshot that prefix caching reuses); raise %s for more, "
            "or set max_num_seqs=%d to say so",
            num_state_slots,
            config.max_num_seqs,
            num_state_slots,
            num_state_slots // SLOTS_PER_SEQUENCE,
            setting,
            num_state_slots,
        )


def log_start_up(model: str, config: Config, info: EngineCoreInfo, seconds: float) -> None:
    """Log the model (as given, and the folder it was read from), its architecture, dtype and device, what
    the model runner measured (weights' memory and load time, the KV cache's capacity, the state cache's
    slots on a model with recurrent layers, the CUDA graphs' capture time where it captured some) and the
    `seconds` the whole start-up took. Rank 0's figures hold for each rank of a tensor-parallel engine."""
    report = info.start_up
    per_rank = " per rank" if config.tensor_parallel_size > 1 else ""
    given = str(model)
    logger.info("model: %s", given if given == config.model else f"{given} (folder {config.model})")
    logger.info(
        "architecture %s, dtype %s, device %s%s",
        config.model_config.architecture,
        str(config.torch_dtype).removeprefix("torch."),
        report.device_name,
        f", tensor_parallel_size {config.tensor_parallel_size}" if per_rank else "",
    )
    logger.info("weights: %s%s, loaded in %.2f s", memory_size(report.weights_bytes), per_rank, report.load_seconds)
    logger.info(
        "KV cache: %s tokens in %d blocks of %d tokens (%s, %s%s)",
        f"{info.num_kvcache_blocks * info.block_size:,}",
        info.num_kvcache_blocks,
        info.block_size,
        info.kv_cache_dtype,
        memory_size(report.kv_cache_bytes),
        per_rank,
    )
    logger.info(
        "KV cache holds %.2f sequences of max_model_len %s tokens at once: %s",
        info.max_concurrency,
        f"{info.max_model_len:,}",
        "; ".join(f"{g.kind} ({g.num_layers} layers) {g.tokens:,} tokens" for g in info.kv_groups),
    )
    if info.num_state_slots:
        logger.info(
            "state cache: %d slots (%s%s)", info.num_state_slots, memory_size(report.state_cache_bytes), per_rank
        )
        _warn_of_fewer_running_states(config, info.num_state_slots)
    if report.graph_capture_seconds is not None:
        logger.info("CUDA graphs captured in %.2f s", report.graph_capture_seconds)
    logger.info("engine ready in %.1f s", seconds)
