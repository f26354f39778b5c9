"""A node other than 0 of a multi-node engine: its tensor-parallel ranks, with no engine and no server.

`run_headless` spawns one process per rank of the node; each meets rank 0 at
the rendezvous store on node 0, connects a `RankLink` to it and runs the
commands rank 0 sends until "exit" (rank 0's engine closed) or until the
connection closes (rank 0 failed or its machine stopped). The node ends with
its first rank that ends: the others are stopped, and the exit code says
whether all ended well.
"""

import logging
import multiprocessing as mp
import os
import sys
import traceback
from multiprocessing.connection import wait

from nanovllm.config import Config
from nanovllm.utils.parallel import NODES_TIMEOUT, rendezvous_address, rendezvous_store
from nanovllm.utils.processes import exit_with_parent, ignore_interrupts
from nanovllm.utils.rank_link import COMMAND_PORT_KEY, RankLink
from nanovllm.worker.tensor_parallel import serve_commands

logger = logging.getLogger(__name__)

_STOP_WAIT_S = 10  # how long the other ranks get to end once one has, before they are killed


def run_remote_rank(config: Config, rank: int, host: str, port: int) -> None:
    """Entry point of rank `rank` on a node other than 0: meet rank 0 at host:port, then serve its commands."""
    exit_with_parent()
    ignore_interrupts()
    link = None
    try:
        store = rendezvous_store(host, port, is_master=False, timeout=NODES_TIMEOUT)
        link = RankLink(host, int(store.get(COMMAND_PORT_KEY)), rank)
        serve_commands(config, rank, store, link)
    except BaseException as e:
        message = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
        print(f"nanovllm: tensor-parallel rank {rank} failed: {message}", file=sys.stderr, flush=True)
        if link is not None:
            link.write_error(message)
        os._exit(1)
    link.close()


def run_headless(config: Config) -> int:
    """Run node `config.node_rank`'s ranks until rank 0 ends them; 0 if every rank ended well, else 1.
    ValueError for node 0, which runs the engine rather than a headless node."""
    if config.node_rank == 0:
        raise ValueError("node_rank 0 runs the engine and the server: leave out --headless there")
    host, port = rendezvous_address(config.master_port, config.master_addr)
    context = mp.get_context("spawn")
    processes = []
    for rank in config.rank_range():
        process = context.Process(
            target=run_remote_rank, args=(config, rank, host, port), name=f"nanovllm-tp{rank}", daemon=True
        )
        process.start()
        processes.append(process)
    ranks = config.rank_range()
    logger.info(
        "node %d of %d: tensor-parallel ranks %d-%d started; they serve rank 0 at %s:%d",
        config.node_rank,
        config.nnodes,
        ranks.start,
        ranks.stop - 1,
        host,
        port,
    )
    try:
        wait([p.sentinel for p in processes])
    finally:
        # the others end with the first: once one rank is gone the group cannot step
        for p in processes:
            p.join(_STOP_WAIT_S)
            if p.is_alive():
                p.kill()
                p.join()
    code = max(abs(p.exitcode) for p in processes)
    logger.info("node %d: its ranks have ended (%s)", config.node_rank, "cleanly" if code == 0 else "with an error")
    return 0 if code == 0 else 1
