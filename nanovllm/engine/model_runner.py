"""Runs the model for one rank: builds it, sizes the KV cache, prepares each step's inputs, samples."""

from itertools import accumulate

import torch

from nanovllm.config import Config
from nanovllm.engine.cuda_graphs import DecodeGraphs
from nanovllm.engine.decode_buffers import DecodeBuffers
from nanovllm.engine.sampling_batch import logprob_dicts, sampling_tensors
from nanovllm.engine.scheduler import ScheduledBatch
from nanovllm.engine.sequence import Sequence
from nanovllm.layers.attention import Attention, make_attention_backend
from nanovllm.layers.sampler import Sampler, SamplingTensors
from nanovllm.models import model_class
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.context import Context, reset_context, set_context
from nanovllm.utils.loader import load_dummy_weights, load_model
from nanovllm.utils.parallel import (all_ranks_min, destroy_process_group, init_process_group, share_cpu_cores,
                                     tensor_parallel)

_GIB = 1 << 30


class ModelRunner:
    """Owns the model, its KV cache and the sampler on one device.

    With `tensor_parallel_size > 1` this is rank `rank`: it joins the group at
    `store` (rank 0 serves it) and holds its share of the model and the cache.
    """

    def __init__(self, config: Config, rank: int = 0, store=None):
        self.config = config
        self.block_size = config.kvcache_block_size
        self.rank = rank
        self.world_size = config.tensor_parallel_size
        self.device = torch.device("cuda", rank) if config.device == "cuda" else torch.device("cpu")
        self.dtype = config.torch_dtype
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world_size > 1:
            init_process_group(store, rank, self.world_size, self.device)
            if self.device.type == "cpu":
                share_cpu_cores(self.world_size)
        torch.manual_seed(config.seed)
        self.model = self._build_model()
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        backend = make_attention_backend(config.attention_backend)
        for layer in self.attention_layers:
            layer.backend = backend
        self.sampler = Sampler()
        if self.device.type == "cuda":
            self._warm_up()
        self._allocate_kv_cache()
        if self.device.type == "cuda":
            self._warm_up_cached_prefix()
        self.decode_buffers = DecodeBuffers(config.max_num_seqs, config.max_blocks_per_seq, self.block_size,
                                            self.device)
        self.graphs = None
        if self.device.type == "cuda" and not config.enforce_eager and backend.supports_cuda_graphs:
            self.graphs = DecodeGraphs(self.model, self.decode_buffers, config.max_num_seqs,
                                       config.hf_config.hidden_size, self.dtype)

    def _build_model(self) -> torch.nn.Module:
        hf_config = self.config.hf_config
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with self.device, tensor_parallel(self.rank, self.world_size):
                model = model_class(hf_config)(hf_config)
        finally:
            torch.set_default_dtype(default_dtype)
        if self.config.load_format == "dummy":
            load_dummy_weights(model, hf_config, self.config.seed)
        else:
            load_model(model, self.config.model)
        return model.eval().requires_grad_(False)

    def _warm_up(self) -> None:
        # The largest prefill the config allows, and sampling for the largest
        # decode batch, set the activation peak the KV-cache sizing must leave room for.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        # no step holds more than max_num_batched_tokens tokens: a longer prompt is chunked
        max_len = min(self.config.max_model_len, self.config.max_num_batched_tokens)
        num_seqs = max(1, min(self.config.max_num_batched_tokens // max_len, self.config.max_num_seqs))
        sampled_one_token = SamplingParams(temperature=1.0, max_tokens=1)
        seqs = [Sequence([0] * max_len, sampled_one_token, self.block_size) for _ in range(num_seqs)]
        self.run(ScheduledBatch(seqs, is_prefill=True))
        logits = torch.zeros(self.config.max_num_seqs, self.config.hf_config.vocab_size, dtype=self.dtype,
                             device=self.device)
        self.sampler(logits, SamplingTensors(temperatures=torch.ones(self.config.max_num_seqs, device=self.device)))
        del logits
        torch.cuda.empty_cache()

    def _warm_up_cached_prefix(self) -> None:
        # The prefill kernel has a second variant for queries over a cached prefix
        # (prefix-cache hits, and every mixed step of decodes and prompt chunks);
        # compile it now rather than in the middle of the first request that needs it.
        seq = Sequence([0, 0], SamplingParams(temperature=1.0, max_tokens=1), self.block_size)
        seq.block_table = [0]
        seq.num_computed_tokens = 1
        self.run(ScheduledBatch([seq], is_prefill=True))

    def _kv_block_bytes(self) -> int:
        hf = self.config.hf_config
        attn = self.attention_layers[0]
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * hf.num_hidden_layers * self.block_size * attn.num_kv_heads * attn.head_dim * itemsize

    def _num_blocks_that_fit(self, block_bytes: int) -> int:
        if self.device.type == "cpu":
            return int(self.config.cpu_kvcache_gb * _GIB) // block_bytes
        free, total = torch.cuda.mem_get_info(self.device)
        stats = torch.cuda.memory_stats(self.device)
        used_elsewhere = total - free
        warm_up_extra = stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]
        budget = total * self.config.gpu_memory_utilization - used_elsewhere - warm_up_extra
        if budget < block_bytes:
            raise ValueError(
                f"no room for the KV cache: one block needs {block_bytes / _GIB:.3f} GiB but only "
                f"{max(budget, 0) / _GIB:.3f} GiB is left of gpu_memory_utilization="
                f"{self.config.gpu_memory_utilization} x {total / _GIB:.1f} GiB; raise "
                f"gpu_memory_utilization, or lower max_model_len/max_num_batched_tokens"
            )
        return int(budget) // block_bytes

    def _allocate_kv_cache(self) -> None:
        config = self.config
        block_bytes = self._kv_block_bytes()
        if config.num_kvcache_blocks == -1:
            # never more than every sequence at full length could use
            config.num_kvcache_blocks = min(self._num_blocks_that_fit(block_bytes),
                                            config.max_num_seqs * config.max_blocks_per_seq)
            if self.world_size > 1:
                # every rank must hold the blocks rank 0's scheduler hands out
                config.num_kvcache_blocks = all_ranks_min(config.num_kvcache_blocks, self.device)
            if config.num_kvcache_blocks < 1:
                raise ValueError(
                    f"cpu_kvcache_gb={config.cpu_kvcache_gb} holds no KV block of "
                    f"{block_bytes / _GIB:.3f} GiB; raise it or lower kvcache_block_size"
                )
        layers = self.attention_layers
        # kv_cache: [2, layers, blocks, block_size, kv_heads, head_dim]
        self.kv_cache = torch.zeros(2, len(layers), config.num_kvcache_blocks, self.block_size,
                                    layers[0].num_kv_heads, layers[0].head_dim, dtype=self.dtype, device=self.device)
        for i, layer in enumerate(layers):
            layer.k_cache, layer.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        pin = self.device.type == "cuda"
        return torch.tensor(values, dtype=dtype, pin_memory=pin).to(self.device, non_blocking=True)

    def _slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat cache slots of positions start..end-1 of `seq`."""
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)] if table else [-1] * (end - start)

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(seq.block_table) for seq in seqs)
        rows = [seq.block_table + [-1] * (width - len(seq.block_table)) for seq in seqs]
        return self._to_device(rows, torch.int32)

    def prepare_prefill(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs of each sequence's scheduled tokens, packed, and the prefill context."""
        input_ids, positions, slots = [], [], []
        seqlens_q, seqlens_k = [], []
        for seq, n in zip(batch.seqs, batch.num_scheduled_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids += seq.chunk_token_ids(n)
            positions += range(start, end)
            slots += self._slots(seq, start, end)
            seqlens_q.append(n)
            seqlens_k.append(end)
        cu_q = list(accumulate(seqlens_q, initial=0))
        cu_k = list(accumulate(seqlens_k, initial=0))
        logits_indices = [cu_q[i + 1] - 1 for i, samples in enumerate(batch.samples) if samples]
        has_prefix = any(seq.num_computed_tokens for seq in batch.seqs)
        set_context(Context(
            is_prefill=True,
            slot_mapping=self._to_device(slots, torch.int64),
            cu_seqlens_q=self._to_device(cu_q, torch.int32),
            cu_seqlens_k=self._to_device(cu_k, torch.int32),
            max_seqlen_q=max(seqlens_q),
            max_seqlen_k=max(seqlens_k),
            seqlens_q=seqlens_q,
            seqlens_k=seqlens_k,
            block_tables=self._block_tables(batch.seqs) if has_prefix else None,
            logits_indices=self._to_device(logits_indices, torch.int64),
        ))
        return self._to_device(input_ids, torch.int64), self._to_device(positions, torch.int64)

    def decode_size(self, num_seqs: int) -> int:
        """Rows a decode step of `num_seqs` runs: a captured graph's size, or exactly `num_seqs` when eager."""
        size = self.graphs.padded_size(num_seqs) if self.graphs is not None else None
        return size or num_seqs

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sequence's last token, its position and slot, and the decode context, padded to `decode_size`."""
        input_ids, positions, slot_mapping, context_lens, block_tables = self.decode_buffers.load(
            seqs, self.decode_size(len(seqs)))
        set_context(Context(
            is_prefill=False,
            slot_mapping=slot_mapping,
            max_seqlen_k=max(seq.num_tokens for seq in seqs),
            context_lens=context_lens,
            block_tables=block_tables,
        ))
        return input_ids, positions

    def _decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # hidden states of every row, graph padding included: a replay when this size was captured
        size = input_ids.size(0)
        if self.graphs is not None and self.graphs.captured(size):
            return self.graphs.replay(size)
        return self.model(input_ids, positions)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[list[int], list[dict[int, float] | None] | None] | None:
        """One forward pass over the batch; rank 0 returns the token ids sampled for
        `batch.sampled_seqs` and, where asked for, their logprobs."""
        if batch.is_prefill:
            hidden_states = self.model(*self.prepare_prefill(batch))
        else:
            hidden_states = self._decode_forward(*self.prepare_decode(batch.seqs))[:len(batch.seqs)]
        sampled = batch.sampled_seqs
        # A step of prompt chunks that all stop short of their end scores nothing.
        logits = self.model.compute_logits(hidden_states) if sampled else None
        reset_context()
        if self.rank != 0:
            return None
        if not sampled:
            return [], None
        tensors = sampling_tensors(sampled, logits.shape[-1], self.config.eos_token_ids, self._to_device)
        output = self.sampler(logits, tensors)
        return output.token_ids.tolist(), logprob_dicts(sampled, output)

    def close(self) -> None:
        """Leave the tensor-parallel group (a no-op with one rank)."""
        if self.world_size > 1:
            destroy_process_group()
