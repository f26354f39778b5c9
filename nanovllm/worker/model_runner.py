"""Runs the model for one rank: starts it up (model, warm-up, KV cache, graphs), then launches each step and its
sampling."""

import time
from dataclasses import replace
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from nanovllm.config import Config
from nanovllm.core.scheduler_output import PLACEHOLDER, SchedulerOutput
from nanovllm.core.structured_output import GrammarBitmasks
from nanovllm.layers.all_reduce import set_up_peer_all_reduce, tear_down_peer_all_reduce
from nanovllm.layers.attention import Attention, make_attention_backend
from nanovllm.layers.recurrent_state import RecurrentLayer
from nanovllm.sample.metadata import DecodeDraw, SamplingTensors, decode_draw, sampling_rows, sampling_tensors
from nanovllm.sample.sampler import Sampler, SamplerOutput, ranks_draw_in_step, token_logprobs
from nanovllm.spec_decode.verification import VerifiedDrafts, first_sampling_rows
from nanovllm.utils.context import forward_context
from nanovllm.utils.parallel import destroy_process_group, init_process_group, share_cpu_cores
from nanovllm.worker.cuda_graphs import MAX_VERIFY_GRAPH_ROWS, DecodeGraphs, max_graph_rows
from nanovllm.worker.decode_buffers import DecodeBuffers
from nanovllm.worker.decode_step import DecodeStep, DeviceInputForward, resolve_placeholders
from nanovllm.worker.draft_states import DraftStates
from nanovllm.worker.executor import Executor, LaunchedForward
from nanovllm.worker.grammar_mask_buffers import GrammarMaskBuffers
from nanovllm.worker.kv_cache import KVCache
from nanovllm.worker.kv_cache_sizing import bind_kv_cache, cache_capacity, kv_cache_spec
from nanovllm.worker.model_loading import build_model, tensor_bytes
from nanovllm.worker.mtp_drafter import MTPDrafter, StepTokens
from nanovllm.worker.pending_output import PendingOutput, PromptScores
from nanovllm.worker.start_up_report import StartUpReport
from nanovllm.worker.state_cache import StateCache, StateCacheSpec
from nanovllm.worker.varlen_inputs import scored_tokens, varlen_inputs
from nanovllm.worker.verify_step import VerifyStep
from nanovllm.worker.warm_up import warm_up, warm_up_cached_prefix

_PROMPT_SCORING_ROWS = 256  # prompt positions whose full-vocabulary logits are held at once


class ModelRunner(Executor):
    """Owns the model, its KV cache and the sampler on one device, and launches each step.

    Start-up runs in this order: the model is built and loaded (`build_model`);
    on CUDA the warm-up runs the largest step the config allows (`warm_up`);
    the KV cache (and, on a model with recurrent layers, the state cache) is
    sized from the memory left and bound to the attention layers (and the
    recurrent ones) (`cache_capacity`, `bind_kv_cache`, `StateCache.bind`); the
    decode step's CUDA graphs are captured (`DecodeGraphs`). `kv_cache_spec` is
    the cache's layout, `kv_cache` its one allocation, `num_kvcache_blocks` its
    capacity and `kv_cache_dtype_name` its element type as vLLM names it
    (`KVCacheSpec.dtype_name`); `state_cache` holds the recurrent states
    (None without recurrent layers) in `num_state_slots` slots (0 without);
    `start_up` is what the runner measured while starting (load time, bytes,
    graph capture time).

    `execute` launches a step and returns without waiting for the device: the
    sampled ids stay on the device (`last_sampled`), where the next step's
    placeholder tokens are gathered from, and travel to the host behind the step
    (`PendingOutput`). A step of prompt chunks (and any decodes beside them)
    runs packed (`varlen_inputs`); a decode step loads its inputs into
    `DecodeBuffers` and replays its graph, samples its greedy and
    plain-temperature rows itself (`DecodeStep`), and hands its logits to the
    full sampler when some row needs more: the LM head runs once a step.
    Either kind of step copies recurrent states between slots as the scheduler
    asks: `state_restores` before its forward pass, `state_snapshots` after
    it. A step with drafts (speculative decoding) samples each drafting request at every
    draft's position and after the last, and its drafts are checked on the
    device (`VerifyStep`); a step whose every request decodes its last token and
    its drafts is a verify step, a decode step of num_speculative_tokens + 1
    queries per request (padded), with CUDA graphs of its own. On a model with
    recurrent layers such steps leave each request's state after every query
    in `draft_states` (a verify step leaves the live slots as they were), and
    each live slot takes the state after the request's last kept token once
    the drafts are checked: inside the decode step where it checks them, else
    right after the full sampler's check, on every rank. With
    `tensor_parallel_size > 1` this is rank `rank`: it joins the group at
    `store` (rank 0 serves it) and holds its share of the model and the cache;
    every rank draws a decode step's greedy and plain-temperature rows itself
    where `ranks_draw_in_step` (CUDA), as rank 0's `plan_draw` says; else rank 0
    samples the gathered logits and broadcasts the ids to the others.

    With speculative method "mtp" the runner also drafts: every step runs
    packed (the varlen path, whose hidden states it keeps for every token; no
    decode graphs for now), and after its sampling the model's
    multi-token-prediction layer runs over the step's tokens and drafts after
    each sampling request's last new token (`MTPDrafter`); the drafts go back
    with the step's output.
    """

    def __init__(self, config: Config, eos_token_ids: tuple[int, ...] = (), rank: int = 0, store=None):
        self.config = config
        self.eos_token_ids = eos_token_ids
        self.block_size = config.kv_block_size
        self.rank = rank
        self.world_size = config.tensor_parallel_size
        self.device = (
            torch.device("cuda", config.device_index(rank)) if config.device_type == "cuda" else torch.device("cpu")
        )
        self.dtype = config.torch_dtype
        self._join_device(store)
        # None without recurrent layers; refuses a tensor-parallel size that splits no state evenly, before loading
        self.state_cache_spec = StateCacheSpec.of(config.kv_layout, self.dtype, self.world_size)
        self.state_cache: StateCache | None = None  # allocated with the KV cache
        self.num_state_slots = 0
        torch.manual_seed(config.seed)
        self.model, load_seconds = self._timed(lambda: build_model(config, self.device, rank, self.world_size))
        backend = make_attention_backend(config.attention_impl)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        for layer in self.attention_layers:
            layer.backend = backend
        self.recurrent_layers = [m for m in self.model.modules() if isinstance(m, RecurrentLayer)]
        self.kv_cache_spec = kv_cache_spec(config, self.attention_layers)
        self.kv_cache: KVCache | None = None  # allocated once the start-up step has measured activations
        self.sampler = Sampler()
        # queries per request of a verify step: the last token and as many drafts as the method proposes
        self.verify_queries = None
        # sampling rows a step may have: one per request and, with speculation, one per query of a verify step
        # (padded), or in a varlen step one more per draft (each a scheduled token, so within the token budget)
        self.max_sampling_rows = config.max_num_seqs
        if config.speculative is not None:
            self.verify_queries = 1 + config.speculative.num_speculative_tokens
            self.max_sampling_rows = config.max_num_seqs * self.verify_queries
        # [max_sampling_rows]: the ids the latest step sampled, in its sampling-row order
        self.last_sampled = torch.zeros(self.max_sampling_rows, dtype=torch.int64, device=self.device)
        self._last_sampled_rows: dict[str, int] = {}  # request id -> its row in last_sampled
        self._forward = DeviceInputForward(self.model, self.last_sampled)
        self._verify_step = None  # the check of steps with drafts
        if config.speculative is not None:
            self._verify_step = VerifyStep(
                config.speculative.num_speculative_tokens,
                config.max_num_seqs,
                self.last_sampled,
                self.world_size,
                self.device,
            )
        verify_outputs = self._verify_step.outputs if self._verify_step is not None else None
        vocab_size = config.model_config.vocab_size
        vocab_slice = (self.rank * vocab_size // self.world_size, vocab_size) if self.world_size > 1 else None
        self._decode_step = DecodeStep(
            self._forward,
            self.world_size == 1 or ranks_draw_in_step(self.device),
            self.block_size,
            verify_outputs,
            vocab_slice,
        )
        # per-position states of steps with drafts; taken before the caches are sized, so that they leave room
        self.draft_states = None
        if config.speculative is not None and self.state_cache_spec is not None:
            self.draft_states = DraftStates.allocate(
                self.state_cache_spec, config.max_num_seqs, self.verify_queries, self.device
            )
        self._grammar_masks = GrammarMaskBuffers(self.max_sampling_rows, self.device)
        self._mtp = self._mtp_step = None  # method "mtp": the drafter, and the tokens of the step it drafts after
        if config.speculative is not None and config.speculative.method == "mtp":
            self._mtp = MTPDrafter(
                self.model,
                config.speculative.num_speculative_tokens,
                self.block_size,
                config.context_len,
                self.kv_cache_spec.prefill_reads_cache,
                self._to_device,
            )
        self.graphs = None
        use_graphs = (
            self.device.type == "cuda"
            and not config.enforce_eager
            and backend.supports_cuda_graphs
            and self._mtp is None
        )
        if use_graphs and self._decode_step.samples:
            # one buffer for every graph's logits, rather than one output per captured shape; taken before
            # the KV cache is sized, so that the cache leaves room for it
            rows = max_graph_rows(config.max_num_seqs, self.verify_queries)
            self._decode_step.logits = torch.empty(
                rows, vocab_size // self.world_size, dtype=self.dtype, device=self.device
            )
        if self.device.type == "cuda":
            self._warm_up_on_the_scratch_slot()
        slot_bytes = self.state_cache_spec.slot_bytes if self.state_cache_spec is not None else 0
        capacity = cache_capacity(config, self.kv_cache_spec.block_bytes, slot_bytes, self.device, self.world_size)
        self.num_kvcache_blocks = capacity.num_blocks
        self.kv_cache = bind_kv_cache(
            self.kv_cache_spec, self.num_kvcache_blocks, self.attention_layers, config.kv_layout, self.device
        )
        self.num_state_slots = capacity.num_state_slots
        if self.state_cache_spec is not None:
            self.state_cache = self.state_cache_spec.allocate(self.num_state_slots, self.device)
            self.state_cache.bind(self.recurrent_layers)
        if self.draft_states is not None:
            self.draft_states.bind(self.recurrent_layers)
            self._decode_step.keep_states = partial(self.draft_states.keep, self.state_cache)
        self.kv_cache_dtype_name = self.kv_cache_spec.dtype_name
        num_groups = len(config.kv_layout.groups)
        if self.device.type == "cuda":
            warm_up_cached_prefix(self._run_start_up_step, num_groups)
        self.decode_buffers = DecodeBuffers(
            config.max_num_seqs,
            config.max_blocks_per_seq,
            self.block_size,
            self.device,
            config.seed,
            self.verify_queries or 1,
            num_groups,
            self.state_cache.scratch_slot if self.state_cache is not None else None,
        )
        capture_seconds = None
        if use_graphs:
            self.graphs, capture_seconds = self._timed(self._capture_graphs)
        self.start_up = StartUpReport(
            self._device_name(),
            tensor_bytes(self.model),
            load_seconds,
            self.num_kvcache_blocks * self.kv_cache_spec.block_bytes,
            self.state_cache.nbytes if self.state_cache is not None else 0,
            capture_seconds,
        )

    def _join_device(self, store) -> None:
        """Make this rank's device current and, with several ranks, join the group at `store`."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world_size > 1:
            init_process_group(store, self.rank, self.world_size, self.device)
            if self.config.nnodes == 1:  # the peer buffers are reached over one host's links
                set_up_peer_all_reduce(self.device)
        # the ranks of every replica on this machine share its cores
        processes = self.config.ranks_per_node * self.config.data_parallel_size
        if self.device.type == "cpu" and processes > 1:
            share_cpu_cores(processes)

    def _capture_graphs(self) -> DecodeGraphs:
        """The decode step's graphs, on the decode buffers, for every batch size (and verify step) captured."""
        return DecodeGraphs(
            self._decode_step, self.decode_buffers, self.config.max_num_seqs, self.verify_queries, MAX_VERIFY_GRAPH_ROWS
        )

    def _timed(self, build):
        """What `build()` returns and the seconds it took, the device's queued work included."""
        start = time.perf_counter()
        result = build()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return result, time.perf_counter() - start

    def _device_name(self) -> str:
        """The device as the start-up log names it: "cuda:0 (NVIDIA H100 80GB HBM3)", or "cpu (N threads)"."""
        if self.device.type == "cuda":
            return f"{self.device} ({torch.cuda.get_device_name(self.device)})"
        return f"cpu ({torch.get_num_threads()} threads)"

    def _warm_up_on_the_scratch_slot(self) -> None:
        """`warm_up`, on a model with recurrent layers with a state cache of the scratch slot alone bound, so
        that the layers run their kernels (not the reference they run unbound) and the peak is theirs; the
        layers let that cache go before the caches are sized."""
        scratch = self.state_cache_spec.allocate(0, self.device) if self.state_cache_spec is not None else None
        if scratch is not None:
            scratch.bind(self.recurrent_layers)
        warm_up(self._run_start_up_step, self.sampler, self.config, self.max_sampling_rows, self.device)
        if scratch is not None:
            scratch.unbind(self.recurrent_layers)
            del scratch
            torch.cuda.empty_cache()

    def _run_start_up_step(self, out: SchedulerOutput) -> None:
        """Run a start-up step (`warm_up`) to its end and forget its samples. On a model with recurrent layers
        its requests have the scratch slot."""
        if self.state_cache_spec is not None:
            out = replace(out, state_slots=[self.num_state_slots] * len(out.req_ids))
        pending = self.execute(out)
        if pending is not None:
            pending.result()
        self._last_sampled_rows = {}

    def _to_device(self, values: list | np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        # pinned memory comes from PyTorch's caching host allocator, which keeps a
        # block from reuse until the copy queued from it has run
        pin = self.device.type == "cuda"
        if isinstance(values, np.ndarray):  # torch.tensor cannot pin an array's copy itself
            host = torch.from_numpy(values).to(dtype)
            host = host.pin_memory() if pin else host
        else:
            host = torch.tensor(values, dtype=dtype, pin_memory=pin)
        return host.to(self.device, non_blocking=True)

    def _src_rows(self, out: SchedulerOutput) -> list[int]:
        """Per request: the row of the previous step's samples that holds its input token still in flight (its
        chunk's last, or its first when drafts follow it), or -1 when the host knows every input token."""
        rows = self._last_sampled_rows
        return [
            rows[req_id] if PLACEHOLDER in (ids[0], ids[-1]) else -1 for req_id, ids in zip(out.req_ids, out.token_ids)
        ]

    def _run_varlen(self, out: SchedulerOutput) -> tuple[torch.Tensor, list[int]]:
        """Prompt chunks and any decodes beside them, packed: hidden states of every token, and where
        each request's tokens start (cumulative query lengths)."""
        new_keys_from_cache = self.kv_cache is not None and self.kv_cache_spec.prefill_reads_cache
        has_state = self.state_cache_spec is not None
        context, input_ids, src_rows, positions, cu_q = varlen_inputs(
            out, self._src_rows(out), self.block_size, new_keys_from_cache, self._to_device, has_state
        )
        if self._mtp is not None:
            # resolved now, for the MTP layer after the step's sampling overwrites the samples its placeholders
            # come from (resolving them again in the forward pass gives the same ids)
            input_ids = resolve_placeholders(input_ids, src_rows, self.last_sampled)
        with forward_context(context):
            hidden_states = self._forward(input_ids, src_rows, positions)
        if self._mtp is not None:
            self._mtp_step = StepTokens(context, input_ids, positions, hidden_states, cu_q)
        return hidden_states, cu_q

    def _score_prompts(self, out: SchedulerOutput, hidden_states: torch.Tensor, cu_q: list[int]) -> PromptScores | None:
        """Log-probabilities of the prompt tokens that follow the positions `out.prompt_scoring` asks for,
        scored from this step's hidden states a slice of rows at a time (full-vocabulary logits of a
        whole chunk would not fit); None on ranks other than 0."""
        jobs = out.prompt_scoring
        rows = self._to_device(
            [cu_q[job.index] + job.offset + j for job in jobs for j in range(len(job.target_ids))], torch.int64
        )
        targets = self._to_device([t for job in jobs for t in job.target_ids], torch.int64)
        k = max(job.num_logprobs for job in jobs)
        parts = []
        for start in range(0, rows.numel(), _PROMPT_SCORING_ROWS):
            logits = self.model.compute_logits(hidden_states[rows[start : start + _PROMPT_SCORING_ROWS]])
            if self.rank == 0:
                parts.append(token_logprobs(logits, targets[start : start + _PROMPT_SCORING_ROWS], k))
        if self.rank != 0:
            return None
        return PromptScores(jobs, *(torch.cat(tensors) for tensors in zip(*parts)))

    def decode_size(self, num_seqs: int, queries: int = 1) -> int:
        """Sequences a decode step of `num_seqs` runs: a captured graph's size, or exactly `num_seqs` when eager."""
        size = self.graphs.padded_size(num_seqs, queries) if self.graphs is not None else None
        return size or num_seqs

    def _queries(self, out: SchedulerOutput) -> int:
        """Queries per request of a decode step: one, or in a verify step its last token and every draft the
        method may propose (padded)."""
        return 1 if out.draft_token_ids is None else self.verify_queries

    def _rows_per_request(self, out: SchedulerOutput) -> int | None:
        """Sampling rows per request of a verify step (padded to fixed shapes); None where each request has
        one per draft and one after them."""
        return self.verify_queries if self._runs_decode(out) and out.draft_token_ids is not None else None

    def _runs_decode(self, out: SchedulerOutput) -> bool:
        """Whether the step runs as a decode step (`DecodeBuffers`, graphs); else packed (`varlen_inputs`), as
        every step is where the MTP layer reads the step's hidden states of every token."""
        return out.is_decode and self._mtp is None

    def _run_decode(self, out: SchedulerOutput, draw: DecodeDraw | None) -> torch.Tensor:
        """Each request's last token (and in a verify step its drafts, padded), the batch padded to a
        captured graph's size and replayed (or run eagerly): where the decode step samples, its logits
        [queries, vocab / ranks], else hidden states [queries, hidden], a request's queries one after
        another. Where it draws (always in a graph; eagerly when `draw.in_step`), the ids drawn at each
        request's temperature are in `last_sampled` too."""
        n, queries = len(out.req_ids), self._queries(out)
        size = self.decode_size(n, queries)
        temperatures = [0.0] * n if draw is None else draw.temperatures
        inputs = self.decode_buffers.load(
            [ids[0] for ids in out.token_ids],
            self._src_rows(out),
            out.num_computed_tokens,
            temperatures,
            out.block_tables,
            size,
            out.draft_token_ids,
            queries,
            out.state_slots,
        )
        if self.graphs is not None and self.graphs.captured(size, queries):
            return self.graphs.replay(size, queries)[: n * queries]
        return self._decode_step(*inputs, sample=draw is not None and draw.in_step)[: n * queries]

    def _sample(
        self, step: LaunchedForward, grammar: GrammarBitmasks | None
    ) -> tuple[SamplerOutput, VerifiedDrafts | None]:
        """Rank 0: the step's sampling settings and grammar masks applied to its logits, the drafts checked
        (in a step with drafts), and each request's new id put in `last_sampled`."""
        out, logits = step.out, step.logits
        rows_per_request = self._rows_per_request(out)
        tensors = sampling_tensors(out, logits.shape[-1], self.eos_token_ids, self._to_device, rows_per_request)
        if grammar is not None:
            if out.draft_token_ids is not None:
                # the masks' rows are requests; with drafts a request's first sampling row is further on
                first_rows = first_sampling_rows(out.draft_token_ids, rows_per_request)
                grammar = replace(grammar, num_rows=logits.size(0), rows=[first_rows[row] for row in grammar.rows])
            tensors = tensors or SamplingTensors()
            tensors.bitmask, tensors.bitmask_rows = self._grammar_masks.to_device(grammar)
        sampled = self.sampler(logits, tensors)
        if out.draft_token_ids is None:
            self.last_sampled[: logits.size(0)].copy_(sampled.token_ids)
            return sampled, None
        return sampled, self._verify_step.check(sampled.token_ids, out, step.drafts_on_device, self._to_device)

    def _sampled_in_step(self, step: LaunchedForward) -> tuple[SamplerOutput, VerifiedDrafts | None]:
        """The ids the decode step drew, with the logprobs its rows ask for read from its logits, and in a
        verify step the check of its drafts, which the step made too."""
        rows = step.logits.size(0)
        verified = None
        if step.out.draft_token_ids is None:
            token_ids = self.last_sampled[:rows]
        else:
            token_ids, verified = self._verify_step.checked_in_step(step.out, rows)
        if step.num_logprobs is None:
            return SamplerOutput(token_ids), verified
        return SamplerOutput(token_ids, *token_logprobs(step.logits, token_ids, step.num_logprobs)), verified

    def _copy_states(self, pairs: list[tuple[int, int]]) -> None:
        """The (source slot or -1 for zeros, destination slot) state copies the scheduler asks for; none (and
        no cost) on a model without recurrent layers, whose steps ask for none."""
        if pairs:
            self.state_cache.copy_states(pairs)

    def plan_draw(self, out: SchedulerOutput, constrained: bool = False) -> DecodeDraw | None:
        """How the step `out` draws its rows inside the decode step (`constrained`: some sampling row is held
        to a grammar); None where the decode step draws nothing: not a decode step, or one that returns
        hidden states. Rank 0 decides, where the sampling settings are, and sends it with the step."""
        if not (self._runs_decode(out) and self._decode_step.samples):
            return None
        return decode_draw(out, self.eos_token_ids, constrained, self._rows_per_request(out))

    @torch.inference_mode()
    def launch_forward(
        self, out: SchedulerOutput, constrained: bool = False, draw: DecodeDraw | None = None
    ) -> LaunchedForward:
        """Queue a step's forward pass and LM head (and, in a decode step whose rows need no more, its
        sampling) without waiting for the device; `constrained`: some sampling row is held to a grammar.
        `draw`: rank 0's `plan_draw` of the step, which the other ranks get with it."""
        prompt_scores = logits = num_logprobs = drafts_on_device = None
        self._copy_states(out.state_restores)
        if draw is None and self.rank == 0:
            draw = self.plan_draw(out, constrained)
        sampled_in_step = draw is not None and draw.in_step
        if self._runs_decode(out):
            num_logprobs = draw.num_logprobs if draw is not None else None
            decoded = self._run_decode(out, draw)
            if out.draft_token_ids is not None and not sampled_in_step:  # only the sampler's check reads them
                n = len(out.req_ids)
                size = self.decode_size(n, self.verify_queries)
                drafts_on_device = self._verify_step.drafts_on_device(self.decode_buffers, size, n)
            # the LM head runs once per step: where the decode step samples, it has the step's logits
            logits, hidden_states = (decoded, None) if self._decode_step.samples else (None, decoded)
            if logits is not None and draw.needs_logits:
                logits = self.model.lm_head.gather(logits)  # every rank's slice, to rank 0
        else:
            hidden_states, cu_q = self._run_varlen(out)
            if out.prompt_scoring:
                prompt_scores = self._score_prompts(out, hidden_states, cu_q)
            hidden_states = hidden_states[self._to_device(scored_tokens(out, cu_q), torch.int64)]
        self._copy_states(out.state_snapshots)
        if out.sampled_req_ids and hidden_states is not None:
            logits = self.model.compute_logits(hidden_states)  # every rank joins the gather to rank 0
        return LaunchedForward(out, logits, sampled_in_step, prompt_scores, num_logprobs, drafts_on_device)

    def run_step(self, out: SchedulerOutput, draw: DecodeDraw | None) -> None:
        """A rank other than 0: the step rank 0 posted, with its `plan_draw`; this rank's part of the forward
        pass and of the sampling."""
        self.launch_sampling(self.launch_forward(out, draw=draw))

    @torch.inference_mode()
    def launch_sampling(self, step: LaunchedForward, grammar: GrammarBitmasks | None = None) -> PendingOutput | None:
        """Queue the sampling of a step whose forward pass is queued. Rank 0 returns the handle of the
        ids sampled for `out.sampled_req_ids` and of the prompt logprobs asked for; other ranks, and a
        step that samples and scores nothing, return None. `grammar` holds the constrained rows, whose
        masks are filled here, while the device runs the forward pass."""
        out, prompt_scores = step.out, step.prompt_scores
        num_sampled = len(out.sampled_req_ids)
        sampled = verified = None
        if num_sampled:
            if self.rank == 0:
                if step.sampled_in_step:
                    sampled, verified = self._sampled_in_step(step)
                else:
                    sampled, verified = self._sample(step, grammar)
            if self.world_size > 1 and not step.sampled_in_step:  # else every rank drew the same ids
                dist.broadcast(self.last_sampled[:num_sampled], src=0)
        if self._verify_step is not None:
            self._verify_step.share_rejections(out, step.sampled_in_step)
            if self.draft_states is not None and out.draft_token_ids is not None and not step.sampled_in_step:
                self._keep_draft_states(step)
        drafts = None
        if self._mtp is not None:
            drafts = self._draft_with_mtp(out, sampled, verified)
        self._last_sampled_rows = {req_id: row for row, req_id in enumerate(out.sampled_req_ids)}
        if self.rank != 0 or (sampled is None and prompt_scores is None):
            return None
        params = out.sampling_params if verified is None else sampling_rows(out, self._rows_per_request(out)).params
        return PendingOutput(sampled, [p.logprobs for p in params], prompt_scores, verified, drafts)

    def _draft_with_mtp(
        self, out: SchedulerOutput, sampled: SamplerOutput | None, verified: VerifiedDrafts | None
    ) -> torch.Tensor | None:
        """The MTP layer over the step's tokens and, where requests sampled, their drafts [requests, k]
        (`MTPDrafter.draft`), from the ids each emitted last."""
        step, self._mtp_step = self._mtp_step, None
        if verified is not None:
            return self._mtp.draft(out, step, verified.last_token_ids, verified.num_emitted)
        return self._mtp.draft(out, step, None if sampled is None else sampled.token_ids, None)

    def _keep_draft_states(self, step: LaunchedForward) -> None:
        """After the check of a step with drafts that the decode step did not check itself: each drafting
        request's live state slot takes its state after its last kept token (the query of its kept drafts),
        from the counts of rejected drafts every rank has (`VerifyStep.share_rejections`); no host sync."""
        out = step.out
        n = len(out.sampled_req_ids)
        if self._runs_decode(out):  # a verify step: its rows are its requests, its drafts and state slots on the device
            _, is_draft = step.drafts_on_device  # [n, queries - 1]
            size = self.decode_size(n, self.verify_queries)
            slots = self.decode_buffers.views(size, self.verify_queries)[-1][:n]
            rows, num_drafts = torch.arange(n, device=self.device), is_draft.sum(dim=1)
        else:  # a varlen step: a sampling request's row is its place in the step; one without drafts keeps its slot
            sampling = [i for i, samples in enumerate(out.samples) if samples]
            scratch = self.state_cache.scratch_slot
            slots = [out.state_slots[i] if drafts else scratch for i, drafts in zip(sampling, out.draft_token_ids)]
            counts = [len(drafts) for drafts in out.draft_token_ids]
            rows, slots, num_drafts = self._to_device([sampling, slots, counts], torch.int64)  # [3, n]
        kept = num_drafts - self._verify_step.outputs.num_rejected[:n]
        self.draft_states.keep(self.state_cache, rows, kept, slots)

    def release_graphs(self) -> None:
        """Destroy the decode graphs now; later decode steps run eagerly. NCCL (2.26 on) destroys or
        aborts a communicator only once every graph that captured its kernels is gone, and waits for
        that forever."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None

    def close(self) -> None:
        """Destroy the decode graphs, then leave the tensor-parallel group (a no-op with one rank)."""
        self.release_graphs()
        if self.world_size > 1:
            tear_down_peer_all_reduce()
            destroy_process_group()
