"""Models named by a Hugging Face Hub id: read from a local Hugging Face cache (offline: nothing here reaches
the network), and local folders used as they are."""

import logging
from pathlib import Path

import pytest
from huggingface_hub import constants

from nanovllm import LLM, SamplingParams
from nanovllm.frontend.model_source import resolve_model

from helpers.hub_cache import add_to_cache


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, in offline mode. huggingface_hub reads its environment when first
    imported, so its constants are set too (and the environment, for processes a test starts)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_id_in_the_cache_is_its_snapshot_folder(hub_cache, qwen3_dir, caplog):
    snapshot = add_to_cache(hub_cache, "tiny-org/tiny-qwen3", qwen3_dir)
    assert resolve_model("tiny-org/tiny-qwen3") == str(snapshot)
    caplog.set_level(logging.INFO, logger="nanovllm")
    llm = LLM("tiny-org/tiny-qwen3", block_size=16, num_kvcache_blocks=16, max_model_len=128)
    want = LLM(qwen3_dir, block_size=16, num_kvcache_blocks=16, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert [o.outputs[0].text for o in llm.generate(["w5 w6"], params, use_tqdm=False)] == [
        o.outputs[0].text for o in want.generate(["w5 w6"], params, use_tqdm=False)
    ]
    assert llm.config.model == str(snapshot)
    assert f"model: tiny-org/tiny-qwen3 (folder {snapshot})" in caplog.messages


def test_a_hub_id_in_neither_the_cache_nor_reachable_says_what_to_do(hub_cache):
    with pytest.raises(FileNotFoundError) as error:
        LLM("tiny-org/absent")
    assert str(error.value) == (
        f"'tiny-org/absent' is not a local folder, and the Hugging Face cache ({hub_cache}) does not hold the Hub "
        f"model of that id, which cannot be downloaded now: offline mode is on (HF_HUB_OFFLINE); run `hf download "
        f"tiny-org/absent` where there is a network (into this cache: HF_HUB_CACHE), or pass a local model folder"
    )


def test_a_local_folder_is_used_as_it_is_even_where_it_reads_as_a_hub_id(hub_cache, qwen3_dir, tmp_path, monkeypatch):
    assert resolve_model(qwen3_dir) == qwen3_dir
    assert resolve_model(Path(qwen3_dir)) == qwen3_dir
    add_to_cache(hub_cache, "tiny-org/tiny-qwen3", qwen3_dir)
    (tmp_path / "tiny-org" / "tiny-qwen3").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("tiny-org/tiny-qwen3") == "tiny-org/tiny-qwen3"


def test_a_missing_path_that_is_no_hub_id_is_a_missing_folder(hub_cache, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model folder '.*/nowhere' does not exist; pass a local Hugging"):
        resolve_model(str(tmp_path / "nowhere"))
