"""Two `nanovllm serve` processes behind sglang-router's cache-aware policy, as docs/multi-node.md deploys
them: the turns of one chat reach the server that holds its prefix, and separate chats spread."""

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers.api_servers import read_metric, wait_until
from helpers.ports import free_port
from helpers.serve_command import start_server

pytest.importorskip("sglang_router")

CHATS = 4


def words(seed: int, n: int) -> str:
    """`n` words of the tiny model's vocabulary, a different run for each seed."""
    return " ".join(f"w{(seed * 37 + i * 11) % 500 + 5}" for i in range(n))


def start_router(workers: list[str], log) -> tuple[subprocess.Popen, str]:
    """sglang-router in front of `workers`, once it forwards requests to them. Its balance thresholds at 0
    make it send a request to the less busy server whenever the two differ, and by prefix when they do not."""
    port = free_port()
    command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--worker-urls", *workers, "--policy", "cache_aware"]
    command += ["--balance-abs-threshold", "0", "--balance-rel-threshold", "1.0"]
    command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # its own metrics
    router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def forwards() -> bool:
        assert router.poll() is None, "the router exited"
        try:
            return httpx.get(f"{url}/v1/models").status_code == 200
        except httpx.TransportError:
            return False

    wait_until(forwards, timeout=60)
    return router, url


@pytest.mark.slow
def test_the_turns_of_a_chat_stay_on_one_server_and_chats_spread(chat_model_dir, tmp_path):
    processes = []
    try:
        with ThreadPoolExecutor(2) as pool:
            started = list(pool.map(lambda _: start_server(chat_model_dir), range(2)))
        processes += [process for process, _ in started]
        servers = [url for _, url in started]
        with open(tmp_path / "router.log", "w") as log:
            router, url = start_router(servers, log)
        processes.append(router)
        chats = [[{"role": "user", "content": words(chat, 40)}] for chat in range(CHATS)]

        def turn(chat: int) -> None:
            body = {"model": "tiny", "messages": chats[chat], "max_tokens": 16, "temperature": 0}
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
            chats[chat] += [
                {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                {"role": "user", "content": words(100 + chat * 10 + len(chats[chat]), 5)},
            ]

        def served() -> list[float]:
            return [read_metric(server, "nanovllm:request_success_total") for server in servers]

        def hits() -> list[float]:
            return [read_metric(server, "nanovllm:prefix_cache_hits_total") for server in servers]

        # the first turns arrive together: the router spreads them over the servers by load
        threads = [threading.Thread(target=turn, args=(chat,)) for chat in range(CHATS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        # a server that finishes a first turn before the others arrive may take one more: spread, not halved
        first_turns = served()
        assert sum(first_turns) == CHATS and min(first_turns) >= 1
        # each later turn, alone, goes by prefix: to the server that ran the chat's turns before, which holds
        # them in its prefix cache
        homes = []
        for chat in range(CHATS):
            where = set()
            for _ in range(2):
                served_before, hits_before = served(), hits()
                turn(chat)
                [server] = [i for i, (a, b) in enumerate(zip(served(), served_before)) if a > b]
                assert hits()[server] - hits_before[server] >= 32  # at least the first turn's whole blocks
                where.add(server)
            assert len(where) == 1, f"chat {chat}'s turns went to servers {where}"
            homes += where
        assert [homes.count(server) for server in range(2)] == first_turns  # each chat stays where it began
    finally:
        for process in processes:
            process.kill()
            process.wait()
