"""Several engine replicas behind one front end (data_parallel_size > 1): each replica is an engine core in a
process of its own (`CoreProcessClient`) with its own KV cache, and each request goes to the replica that
holds the fewest unfinished requests.

The balancing knows nothing of prefixes: the turns of one chat may land on
different replicas and miss each other's cache. A router in front of several
servers can route by prefix instead (docs/multi-node.md).
"""

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from nanovllm.config import Config
from nanovllm.engine.core_client import CoreProcessClient
from nanovllm.engine.engine_client import EngineClient, EngineDeadError
from nanovllm.engine.messages import EngineCoreOutput, EngineCoreRequest, EngineStats


def replica_config(config: Config, index: int) -> Config:
    """Replica `index`'s config: its own GPUs and, where the port is fixed, its own rendezvous port."""
    port = config.master_port + index if config.master_port else 0
    return replace(config, data_parallel_rank=index, master_port=port)


def combined_stats(stats: list[EngineStats]) -> EngineStats:
    """The replicas' load and counters summed; the KV-cache use is their mean (the caches are the same size)."""
    per_pos = [sum(values) for values in zip(*(s.spec_decode_num_accepted_tokens_per_pos for s in stats))]
    return EngineStats(
        num_running=sum(s.num_running for s in stats),
        num_waiting=sum(s.num_waiting for s in stats),
        kv_cache_usage=sum(s.kv_cache_usage for s in stats) / len(stats),
        prefix_cache_queries=sum(s.prefix_cache_queries for s in stats),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in stats),
        num_preemptions=sum(s.num_preemptions for s in stats),
        spec_decode_num_drafts=sum(s.spec_decode_num_drafts for s in stats),
        spec_decode_num_draft_tokens=sum(s.spec_decode_num_draft_tokens for s in stats),
        spec_decode_num_accepted_tokens=sum(s.spec_decode_num_accepted_tokens for s in stats),
        spec_decode_num_accepted_tokens_per_pos=per_pos,
    )


class DataParallelClient(EngineClient):
    """`config.data_parallel_size` replicas, started together; `info` is replica 0's (all are alike).

    `add_request` and `abort` may be called from any thread, `get_outputs` from
    one: a thread per replica reads that replica's outputs into one queue. If a
    replica dies, `get_outputs` raises EngineDeadError naming it, as for one
    engine whose core died. `requests_sent[i]` counts the requests replica `i`
    was given.
    """

    def __init__(self, config: Config, eos_token_ids: tuple[int, ...], vocabulary=None):
        size = config.data_parallel_size
        with ThreadPoolExecutor(size) as pool:
            starts = [
                pool.submit(CoreProcessClient, replica_config(config, i), eos_token_ids, vocabulary)
                for i in range(size)
            ]
        failed = [start.exception() for start in starts if start.exception() is not None]
        self.replicas = [start.result() for start in starts if start.exception() is None]
        if failed:
            for replica in self.replicas:
                replica.shutdown()
            raise failed[0]
        self.info = self.replicas[0].info
        self.requests_sent = [0] * size
        self._lock = threading.Lock()
        self._owner: dict[str, int] = {}  # unfinished request id -> its replica
        self._unfinished = [0] * size
        self._outputs: queue.SimpleQueue = queue.SimpleQueue()
        self._readers = [
            threading.Thread(target=self._read, args=(i,), name=f"nanovllm-dp{i}-outputs", daemon=True)
            for i in range(size)
        ]
        for reader in self._readers:
            reader.start()

    def add_request(self, request: EngineCoreRequest) -> None:
        with self._lock:
            index = min(range(len(self.replicas)), key=self._unfinished.__getitem__)
            self._owner[request.request_id] = index
            self._unfinished[index] += 1
            self.requests_sent[index] += 1
        try:
            self.replicas[index].add_request(request)
        except BaseException:
            with self._lock:
                self._finish(request.request_id)
            raise

    def abort(self, request_ids: list[str]) -> None:
        by_replica: dict[int, list[str]] = {}
        with self._lock:
            for request_id in request_ids:
                index = self._finish(request_id)
                if index is not None:
                    by_replica.setdefault(index, []).append(request_id)
        for index, ids in by_replica.items():
            self.replicas[index].abort(ids)

    def get_outputs(self) -> list[EngineCoreOutput] | None:
        """The next outputs any replica sent; None after `shutdown`; EngineDeadError if a replica died."""
        index, outputs = self._outputs.get()
        if isinstance(outputs, EngineDeadError):
            raise EngineDeadError(f"data-parallel replica {index}: {outputs}")
        if outputs is not None:
            with self._lock:
                for output in outputs:
                    if output.finish_reason is not None:
                        self._finish(output.request_id)
        return outputs

    def stats(self) -> EngineStats:
        return combined_stats([replica.stats() for replica in self.replicas])

    def shutdown(self) -> None:
        """Stop every replica's core."""
        for replica in self.replicas:
            replica.shutdown()
        for reader in self._readers:
            reader.join()

    def _read(self, index: int) -> None:
        """Replica `index`'s outputs into the queue until its core stops (None) or dies (the error)."""
        try:
            while (outputs := self.replicas[index].get_outputs()) is not None:
                self._outputs.put((index, outputs))
        except EngineDeadError as e:
            self._outputs.put((index, e))
            return
        self._outputs.put((index, None))

    def _finish(self, request_id: str) -> int | None:
        """Forget an unfinished request; its replica, or None if it was not unfinished. Holds `_lock`."""
        index = self._owner.pop(request_id, None)
        if index is not None:
            self._unfinished[index] -= 1
        return index
