"""Tensor parallelism across processes: rank 0 in the caller, ranks 1..N-1 as spawned workers, or, with
nnodes > 1, the ranks of node 0 spawned here and those of the other nodes connected over TCP.

Rank 0 posts each step (`worker/rank_commands.py`) to every other rank, on a
`CommandChannel` (a shared-memory ring) for the workers of its own machine and
over a `RemoteRank` connection (`utils/rank_link.py`) for the ranks of other
nodes, and runs it on its own `ModelRunner` without waiting for the other ranks
to have run it, or the steps before: the ranks meet in the collectives inside
the model, which keep them in step on the device, so rank 0's host work per
step does not grow with the ranks (it waits only while a rank is
`RING_SLOTS` commands behind). Rank 0 waits for every rank to be done
only where it relies on that: the start-up (each rank met the rendezvous,
then built its runner) and shutting down (the workers exit). A rank that fails
leaves its error in the channel (or sends it) and exits, which also breaks
rank 0 out of any collective it waits in, so the caller gets the rank's message
instead of a hang. Workers exit when rank 0's process dies (the ranks of other
nodes when their connection closes).
"""

import multiprocessing as mp
import os
import threading
import time
import traceback
import weakref
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import wait

import torch.distributed as dist

from nanovllm.config import Config
from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.core.structured_output import GrammarBitmasks
from nanovllm.layers.all_reduce import abort_peer_waits
from nanovllm.utils.command_channel import RING_SLOTS, CommandChannel
from nanovllm.utils.parallel import NODES_TIMEOUT, destroy_process_group, rendezvous_address, rendezvous_store
from nanovllm.utils.processes import exit_with_parent, ignore_interrupts
from nanovllm.utils.rank_link import COMMAND_PORT_KEY, RankListener, RemoteRank
from nanovllm.worker.executor import Executor, LaunchedForward
from nanovllm.worker.model_runner import ModelRunner
from nanovllm.worker.pending_output import PendingOutput
from nanovllm.worker.rank_commands import CommandDecoder, CommandEncoder, encode_call

_POLL_S = 0.2  # how often a waiting rank 0 checks that the workers live
_FAILURE_GRACE_S = 2.0  # how long a failed step waits for a rank to be seen ending, to name it
_FAILURE_POLL_S = 0.05  # how long each rank is watched a round of that wait
_EXIT_WAIT_S = 10  # how long a worker may take to leave on "exit" before it is terminated


def channel_capacity(config: Config) -> int:
    """Bytes that hold the largest possible step: every sequence at full length with its tables sent whole (a
    prefill with cached prefixes, or the first step after a preemption), with its id and the tables' update
    headers. Encoded token and block ids take at most 5 bytes each; pages of the segment cost memory only
    once written."""
    return config.max_num_seqs * (6 * (config.context_len + config.max_blocks_per_seq) + 256) + (1 << 16)


def serve_commands(config: Config, rank: int, store, endpoint) -> None:
    """Build rank `rank`'s runner, then run rank 0's commands from `endpoint` (a `CommandChannel` worker's
    `_LocalEndpoint`, or a `RankLink`) until "exit"."""
    runner = ModelRunner(config, rank=rank, store=store)
    endpoint.mark_done()  # built
    commands = CommandDecoder()
    while True:
        method, args = commands.decode(endpoint.receive())
        if method == "exit":
            break
        getattr(runner, method)(*args)
        endpoint.mark_done()
    runner.close()


@dataclass
class _LocalEndpoint:
    """Worker `worker`'s side of the channel, as `serve_commands` reads it."""

    channel: CommandChannel
    worker: int

    def receive(self) -> bytes:
        return self.channel.receive(self.worker)

    def mark_done(self) -> None:
        self.channel.mark_done(self.worker)


def run_worker(config: Config, rank: int, host: str, port: int, channel: CommandChannel) -> None:
    """Entry point of rank `rank` >= 1 on rank 0's machine: build the runner, then run rank 0's commands
    until "exit"."""
    exit_with_parent()
    ignore_interrupts()
    worker = rank - 1
    try:
        store = rendezvous_store(host, port, is_master=False)
        channel.mark_done(worker)  # reached the rendezvous
        serve_commands(config, rank, store, _LocalEndpoint(channel, worker))
    except BaseException as e:
        channel.write_error(worker, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}")
        channel.close()
        os._exit(1)
    channel.close()


@dataclass
class _LocalRank:
    """Rank 0's view of one worker process of its own machine, as of a `RemoteRank`: its answers on the
    channel, its life, and why it ended."""

    channel: CommandChannel
    worker: int  # its index in the channel: rank - 1
    process: mp.Process

    def wait_done(self, marks: int, timeout: float) -> bool:
        return self.channel.wait_done(self.worker, marks, timeout)

    def alive(self, timeout: float = 0.0) -> bool:
        """Whether the process runs, waiting up to `timeout` seconds for one that is exiting."""
        self.process.join(timeout)
        return self.process.is_alive()

    def describe(self) -> str:
        message = self.channel.read_error(self.worker)
        if message:
            return f"tensor-parallel worker {self.worker + 1} failed: {message}"
        return (
            f"tensor-parallel worker {self.worker + 1} (pid {self.process.pid}) exited unexpectedly with code "
            f"{self.process.exitcode}"
        )


@dataclass
class _Workers:
    """What shutting down needs, apart from the TensorParallelRunner so that a finalizer can hold it:
    the channel, the worker processes, the connections to the ranks of other nodes, rank 0's
    ModelRunner once built, and the thread that aborts the group when a rank dies."""

    channel: CommandChannel
    processes: list = field(default_factory=list)
    remote: list[RemoteRank] = field(default_factory=list)
    listener: RankListener | None = None
    rank0: ModelRunner | None = None
    watcher: threading.Thread | None = None
    healthy: bool = True
    closing: threading.Event = field(default_factory=threading.Event)

    def ranks(self) -> list:
        """Every rank but 0, in rank order: `_LocalRank`s, then `RemoteRank`s."""
        local = [_LocalRank(self.channel, i, p) for i, p in enumerate(self.processes)]
        return local + self.remote


def _shut_down(workers: _Workers) -> None:
    """Stop the workers (politely when they are idle and well), leave the group, free the segment."""
    workers.closing.set()
    command = encode_call("exit")
    if (
        workers.healthy
        and all(rank.alive() for rank in workers.ranks())
        and workers.channel.wait_for_room(len(command), _EXIT_WAIT_S)
    ):
        workers.channel.post(command)
        for remote in workers.remote:
            remote.send(command)
        _leave_group(workers)  # the workers leave the group at the same time
        for p in workers.processes:
            p.join(_EXIT_WAIT_S)
    for p in workers.processes:
        if p.is_alive():
            p.terminate()
            p.join(1)
        if p.is_alive():
            p.kill()
            p.join()
    for remote in workers.remote:
        remote.close()  # a remote rank still running exits when its connection closes
    if workers.listener is not None:
        workers.listener.close()
    _leave_group(workers)
    workers.channel.close(unlink=True)


def _leave_group(workers: _Workers) -> None:
    # Rank 0's decode graphs go first: until they are destroyed NCCL can neither destroy the
    # communicator nor finish an abort that the watcher started when a worker died.
    if workers.rank0 is not None:
        workers.rank0.release_graphs()
    if workers.watcher is not None:  # it stops on `closing`, or once its abort returns
        workers.watcher.join(_EXIT_WAIT_S)
    destroy_process_group()


def _abort_group_when_a_worker_dies(workers: _Workers) -> None:
    # NCCL waits for a dead peer forever; aborting the group releases rank 0's kernels at once,
    # though the abort itself returns only after rank 0's graphs are destroyed.
    # (gloo notices the closed connection by itself.) A remote rank's connection is peeked at,
    # never read: the thread that steps reads its answers.
    sentinels = [p.sentinel for p in workers.processes]
    while not workers.closing.is_set():
        if sentinels and wait(sentinels, _POLL_S):
            break
        if not sentinels:
            workers.closing.wait(_POLL_S)
        if any(remote.lost() for remote in workers.remote):
            break
    if not workers.closing.is_set():
        abort_peer_waits()  # the peer all-reduce spins on the device, where no group abort reaches
    if not workers.closing.is_set() and dist.is_initialized():
        with suppress(RuntimeError, ValueError):  # PyTorch's own watchdog may have aborted it first
            dist.distributed_c10d._abort_process_group()


class TensorParallelRunner(Executor):
    """Rank 0's model runner together with the other ranks, which mirror every call: worker processes it
    spawns for the ranks of its own machine, and, with nnodes > 1, the ranks of the other nodes, which
    connect to it (`nanovllm serve --headless` runs them).

    `close()` (also called when the object is collected
    or the interpreter exits) stops the workers and removes the shared-memory
    segment; the ranks of other nodes stop with it.
    """

    def __init__(self, config: Config, eos_token_ids: tuple[int, ...] = ()):
        if dist.is_initialized():
            raise RuntimeError(
                "another engine with tensor_parallel_size > 1 is running in this process; close it "
                "(llm.close() or del llm) first"
            )
        host, port = rendezvous_address(config.master_port, config.master_addr)
        store = rendezvous_store(host, port, is_master=True)
        self.port = store.port
        local_ranks = range(1, config.ranks_per_node)
        context = mp.get_context("spawn")
        self._workers = _Workers(CommandChannel(len(local_ranks), channel_capacity(config), context))
        self._finalizer = weakref.finalize(self, _shut_down, self._workers)
        self._commands = CommandEncoder()
        # the marks each other rank has made once it did all it was asked: met the rendezvous, built its runner,
        # then one per command (`synchronize`)
        self._marks = 1
        if config.nnodes > 1:
            self._workers.listener = RankListener(host)
            store.set(COMMAND_PORT_KEY, str(self._workers.listener.port))
        for rank in local_ranks:
            process = context.Process(
                target=run_worker,
                args=(config, rank, host, self.port, self.channel),
                name=f"nanovllm-tp{rank}",
                daemon=True,
            )
            process.start()
            self._workers.processes.append(process)
        self._guarded(lambda: None, synchronize=True)  # a worker's failure to meet is reported now
        if config.nnodes > 1:
            remote_ranks = range(config.ranks_per_node, config.tensor_parallel_size)
            self._workers.remote = self._guarded(
                lambda: self._workers.listener.accept(
                    remote_ranks, config.ranks_per_node, NODES_TIMEOUT.total_seconds()
                ),
            )
        if config.device_type == "cuda":
            self._workers.watcher = threading.Thread(
                target=_abort_group_when_a_worker_dies, args=(self._workers,), daemon=True
            )
            self._workers.watcher.start()
        self._marks += 1  # built
        # the ranks' runners are all built before the first step is posted; and a rank that fails to is named here
        self.runner = self._workers.rank0 = self._guarded(
            lambda: ModelRunner(config, eos_token_ids, 0, store), synchronize=True
        )
        self.num_kvcache_blocks = self.runner.num_kvcache_blocks
        self.num_state_slots = self.runner.num_state_slots  # every rank's: the sizing takes the least over them
        self.kv_cache_dtype_name = self.runner.kv_cache_dtype_name
        self.start_up = self.runner.start_up

    @property
    def channel(self) -> CommandChannel:
        return self._workers.channel

    @property
    def processes(self) -> list[mp.Process]:
        """The worker processes of rank 0's machine."""
        return self._workers.processes

    @property
    def remote_ranks(self) -> list[RemoteRank]:
        """The connections to the ranks of the other nodes."""
        return self._workers.remote

    def launch_forward(self, out: SchedulerOutput, constrained: bool = False) -> LaunchedForward:
        """Post a step to every other rank, which runs all of its part (they get the step without the sampling
        settings, and with how its rows are drawn inside the decode step), then launch rank 0's forward pass
        alone. The other ranks are not waited for: the model's collectives keep them in step."""
        if not self._finalizer.alive:
            raise RuntimeError("this engine's tensor-parallel workers were shut down; create a new LLM")
        return self._guarded(lambda: self._post_and_launch(out, constrained))

    def _post_and_launch(self, out: SchedulerOutput, constrained: bool) -> LaunchedForward:
        self._raise_if_a_worker_exited()
        draw = self.runner.plan_draw(out, constrained)
        self._post(self._commands.step(out, draw))
        return self.runner.launch_forward(out, constrained, draw)

    def _post(self, command: bytes) -> None:
        """Post `command` to every other rank, waiting only while one is `RING_SLOTS` commands behind."""
        self._marks += 1
        while not self.channel.wait_for_room(len(command), _POLL_S):
            self._raise_if_a_worker_exited()
        self.channel.post(command)
        for remote in self.remote_ranks:
            # TCP would buffer more, but a rank far behind holds rank 0 up as a full ring does
            self._wait_for(remote, self._marks - RING_SLOTS)
            remote.send(command)

    def launch_sampling(self, step: LaunchedForward, grammar: GrammarBitmasks | None = None) -> PendingOutput | None:
        """Rank 0 samples (and sends the ids to the workers, unless every rank drew them in the decode step);
        rank 0's handle of the sampled ids."""
        pending = self._guarded(lambda: self.runner.launch_sampling(step, grammar))
        return None if pending is None else _GuardedOutput(self, pending)

    def check_workers(self) -> None:
        """RuntimeError naming the first rank that has exited (or, on another node, lost its connection),
        after stopping the others; for an idle engine, which no step would tell."""
        self._guarded(self._raise_if_a_worker_exited)

    def synchronize(self) -> None:
        """Wait until every other rank has run every command posted to it; RuntimeError naming a rank that
        failed, after stopping the others."""
        self._guarded(lambda: None, synchronize=True)

    def _raise_if_a_worker_exited(self) -> None:
        for rank in self._workers.ranks():
            if not rank.alive():
                raise RuntimeError(rank.describe())

    def close(self) -> None:
        """Stop the workers and free the shared memory (idempotent)."""
        self._finalizer()

    def _guarded(self, rank0_work, synchronize: bool = False):
        """Do rank 0's part, then (`synchronize`) wait until every other rank has done all it was asked; on
        any failure shut everything down and raise, naming the rank that failed when one did."""
        try:
            result = rank0_work()
            if synchronize:
                for rank in self._workers.ranks():
                    self._wait_for(rank, self._marks)
            return result
        except BaseException as e:
            failure = self._worker_failure()
            self._workers.healthy = False
            self._finalizer()
            if failure:
                raise RuntimeError(failure) from e
            raise

    @staticmethod
    def _wait_for(rank, marks: int) -> None:
        """Wait until `rank` (a `_LocalRank` or a `RemoteRank`) has made `marks` marks; RuntimeError if it ends."""
        while not rank.wait_done(marks, _POLL_S):
            if not rank.alive():
                raise RuntimeError(rank.describe())

    def _worker_failure(self) -> str:
        """What went wrong with the first rank that ended, or '' if all still run after `_FAILURE_GRACE_S`."""
        # a rank that broke rank 0's collective is exiting now: its process or its link may end a moment after
        # the collective's connection did, later still on a loaded machine
        deadline = time.monotonic() + _FAILURE_GRACE_S
        while True:
            for rank in self._workers.ranks():
                if not rank.alive(_FAILURE_POLL_S):
                    return rank.describe()
            if time.monotonic() >= deadline:
                return ""


class _GuardedOutput:
    """Rank 0's pending output, read so that a worker's failure during the step names that worker."""

    def __init__(self, runner: TensorParallelRunner, pending: PendingOutput):
        self._runner = runner
        self._pending = pending

    def result(self):
        return self._runner._guarded(self._pending.result)
