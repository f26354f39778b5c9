"""The offline API in vLLM's shapes: prompt forms, RequestOutput/CompletionOutput, chat, n and best_of
over a shared prompt, prompt logprobs against transformers, logit bias, max_tokens=None, stop reasons, and
chat's reasoning split (on scripted replies)."""

import math

import pytest

from nanovllm import LLM, CompletionOutput, RequestOutput, SamplingParams
from nanovllm.entrypoints.reasoning import READS_SPECIAL_TOKENS, REASONING_PARSERS
from nanovllm.sampling_params import StructuredOutputsParams

from helpers.hf_reference import hf_greedy, hf_logprobs
from helpers.prompts import random_prompts
from helpers.scripted_replies import scripted_replies
from helpers.tiny_models import VOCAB_SIZE

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(qwen3_dir):
    return LLM(qwen3_dir, block_size=BLOCK, num_kvcache_blocks=64, max_model_len=256)


@pytest.fixture(scope="module")
def chat_llm(chat_model_dir):
    return LLM(chat_model_dir, block_size=BLOCK, num_kvcache_blocks=64, max_model_len=256)


def test_one_text_prompt_is_one_request(llm):
    [out] = llm.generate("w5 w6 w7", GREEDY, use_tqdm=False)
    assert isinstance(out, RequestOutput) and out.finished and out.prompt == "w5 w6 w7"
    assert out.prompt_token_ids == [5, 6, 7]
    [completion] = out.outputs
    assert isinstance(completion, CompletionOutput) and completion.index == 0 and completion.finished()
    assert completion.token_ids == hf_greedy(llm.config.model, [[5, 6, 7]], 8)[0]
    assert completion.text.startswith(" w") and completion.finish_reason == "length"


@pytest.mark.parametrize("prompt", [[5, 6, 7], {"prompt_token_ids": [5, 6, 7]}, {"prompt": "w5 w6 w7"}])
def test_token_ids_and_prompt_dicts_are_one_prompt_each(llm, prompt):
    [out] = llm.generate(prompt, GREEDY, use_tqdm=False)
    assert out.prompt_token_ids == [5, 6, 7]
    assert out.prompt == ("w5 w6 w7" if isinstance(prompt, dict) and "prompt" in prompt else None)
    assert out.outputs[0].token_ids == llm.generate("w5 w6 w7", GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_a_list_mixes_prompt_forms_and_keeps_order(llm):
    outputs = llm.generate(["w5 w6", [7, 8], {"prompt_token_ids": [9]}], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == [[5, 6], [7, 8], [9]]
    assert len({o.request_id for o in outputs}) == 3


def test_default_sampling_params_make_sixteen_tokens(llm):
    [out] = llm.generate([5, 6], SamplingParams(temperature=0, ignore_eos=True), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 16


def test_get_tokenizer_is_the_folders(llm):
    assert llm.get_tokenizer().encode("w5 w6") == [5, 6]


def test_chat_renders_the_template_for_one_conversation_or_several(chat_llm):
    conversation = [{"role": "system", "content": "w20"}, {"role": "user", "content": "w5 w6"}]
    [out] = chat_llm.chat(conversation, GREEDY, use_tqdm=False)
    assert out.prompt == "w20 w5 w6 w3" and out.prompt_token_ids == [20, 5, 6, 3]
    assert out.outputs[0].token_ids == chat_llm.generate([20, 5, 6, 3], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    outputs = chat_llm.chat([conversation, [{"role": "user", "content": "w9"}]], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == [[20, 5, 6, 3], [9, 3]]


def test_chat_template_options(chat_llm):
    user = [{"role": "user", "content": "w9"}]
    assert chat_llm.chat(user, GREEDY, add_generation_prompt=False, use_tqdm=False)[0].prompt_token_ids == [9]
    assert chat_llm.chat(user, GREEDY, chat_template_kwargs={"shout": True}, use_tqdm=False)[0].prompt_token_ids == [
        9,
        3,
        4,
    ]
    continued = user + [{"role": "assistant", "content": "w11"}]
    assert chat_llm.chat(continued, GREEDY, add_generation_prompt=False, continue_final_message=True, use_tqdm=False)[
        0
    ].prompt_token_ids == [9, 11]
    with pytest.raises(ValueError, match="cannot both be true"):
        chat_llm.chat(continued, GREEDY, continue_final_message=True, use_tqdm=False)
    with pytest.raises(ValueError, match="assistant cannot speak first"):
        chat_llm.chat([{"role": "assistant", "content": "w5"}], GREEDY, use_tqdm=False)
    assert not chat_llm.has_unfinished_requests()


def test_n_completions_share_the_prompt_and_repeat_with_a_seed(llm):
    prompt = random_prompts([3 * BLOCK + 5], seed=30)[0]
    params = SamplingParams(temperature=1.0, n=4, seed=7, max_tokens=12, ignore_eos=True)
    before = llm.client.core.stats()
    [out] = llm.generate([prompt], params, use_tqdm=False)
    after = llm.client.core.stats()
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    # the first completion computes the prompt; the other three read its three full blocks from the cache
    assert after.prefix_cache_hits - before.prefix_cache_hits == 3 * 3 * BLOCK
    again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    # completion i draws from seed + i
    single = SamplingParams(temperature=1.0, seed=9, max_tokens=12, ignore_eos=True)
    assert llm.generate([prompt], single, use_tqdm=False)[0].outputs[0].token_ids == out.outputs[2].token_ids


def test_greedy_n_completions_are_all_the_greedy_one(llm):
    [out] = llm.generate([5, 6, 7], SamplingParams(temperature=0, n=3, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert [c.token_ids for c in out.outputs] == hf_greedy(llm.config.model, [[5, 6, 7]], 6) * 3


def test_best_of_returns_the_n_most_likely_completions(llm):
    params = SamplingParams(temperature=1.0, n=2, best_of=5, seed=3, max_tokens=6, ignore_eos=True)
    [out] = llm.generate([5, 6, 7], params, use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1] and out.outputs[0].logprobs is None
    every = llm.generate(
        [5, 6, 7],
        SamplingParams(temperature=1.0, n=5, seed=3, max_tokens=6, ignore_eos=True, logprobs=0),
        use_tqdm=False,
    )[0].outputs
    ranked = sorted(every, key=lambda c: -c.cumulative_logprob)[:2]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in ranked]
    assert [c.cumulative_logprob for c in out.outputs] == pytest.approx([c.cumulative_logprob for c in ranked])


@pytest.mark.parametrize("budget", [256, 7])  # whole, and chunks that split the prompt
def test_prompt_logprobs_equal_transformers(qwen3_dir, budget):
    prompt = random_prompts([20], seed=31)[0]
    llm = LLM(qwen3_dir, block_size=BLOCK, num_kvcache_blocks=64, max_model_len=256, max_num_batched_tokens=budget)
    llm.generate([prompt], GREEDY, use_tqdm=False)  # its blocks are in the prefix cache now
    [out] = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=3), use_tqdm=False
    )
    assert out.num_cached_tokens == 0  # every prompt position's logits are computed again
    reference = hf_logprobs(qwen3_dir, prompt[:1], prompt[1:])  # [19, vocab]: the logits of positions 0..18
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for i, position in enumerate(out.prompt_logprobs[1:]):
        actual = prompt[i + 1]
        top = reference[i].topk(3).indices.tolist()
        assert list(position) == [actual] + [t for t in top if t != actual]
        assert position[actual].logprob == pytest.approx(float(reference[i, actual]), abs=1e-4)
        assert position[actual].rank == int((reference[i] > reference[i, actual]).sum()) + 1
        assert position[actual].decoded_token == f"w{actual}"


def test_logit_bias_forces_or_forbids_a_token(llm):
    free = llm.generate([5, 6, 7], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    forced = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logit_bias={42: 100.0})
    assert llm.generate([5, 6, 7], forced, use_tqdm=False)[0].outputs[0].token_ids == [42] * 4
    banned = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logit_bias={free[0]: -100.0})
    assert llm.generate([5, 6, 7], banned, use_tqdm=False)[0].outputs[0].token_ids[0] != free[0]
    with pytest.raises(ValueError, match="logit_bias names token ids \\[512\\]"):
        llm.generate([5], SamplingParams(logit_bias={512: 1.0}), use_tqdm=False)


def test_max_tokens_none_runs_to_the_end_of_the_context(qwen3_dir):
    llm = LLM(qwen3_dir, block_size=BLOCK, num_kvcache_blocks=64, max_model_len=40)
    [out] = llm.generate([5] * 30, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 10 and out.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="leaves no room"):
        llm.generate([5] * 40, SamplingParams(max_tokens=None), use_tqdm=False)


def test_stop_reason_names_the_stop_token_or_string(llm):
    free = llm.generate([5, 6, 7], GREEDY, use_tqdm=False)[0].outputs[0]
    by_token = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[free.token_ids[2]])
    completion = llm.generate([5, 6, 7], by_token, use_tqdm=False)[0].outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", free.token_ids[2])
    stop = free.text.split()[3]
    by_string = SamplingParams(temperature=0, max_tokens=8, stop=["w999", stop])
    completion = llm.generate([5, 6, 7], by_string, use_tqdm=False)[0].outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    assert llm.generate([5, 6, 7], GREEDY, use_tqdm=False)[0].outputs[0].stop_reason is None


def test_abort_ends_every_completion_of_a_request(llm):
    request_id = llm.add_request([5, 6], SamplingParams(temperature=1.0, n=3, max_tokens=50, ignore_eos=True))
    llm.step()
    llm.step()
    llm.abort(request_id)
    assert not llm.has_unfinished_requests()
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == 64
    assert llm.client.core.stats().num_running == 0


@pytest.mark.parametrize(
    "prompt",
    [
        {"prompt": "w5 w6 w7", "multi_modal_data": None},
        {"prompt_token_ids": [5, 6, 7], "multi_modal_data": None, "mm_processor_kwargs": None, "cache_salt": None},
    ],
)
def test_prompt_dicts_take_vllms_other_keys_as_none(llm, prompt):
    [out] = llm.generate(prompt, GREEDY, use_tqdm=False)
    assert out.prompt_token_ids == [5, 6, 7]


@pytest.mark.parametrize(
    "prompt, message",
    [
        (
            {"prompt": "w5", "multi_modal_data": {"image": object()}},
            "multi_modal_data is not supported: this is a text-only model",
        ),
        (
            {"prompt": "w5", "mm_processor_kwargs": {"size": 4}},
            "mm_processor_kwargs is not supported .* set it to None",
        ),
        ({"prompt": "w5", "prompt_token_ids": [5]}, "a prompt dict takes exactly one key"),
    ],
)
def test_prompt_dicts_refuse_what_a_text_only_model_cannot_take(llm, prompt, message):
    with pytest.raises(ValueError, match=f"prompt 0: {message}"):
        llm.generate([prompt], GREEDY, use_tqdm=False)
    assert not llm.has_unfinished_requests()


def test_chat_joins_text_content_parts_one_per_line(chat_llm):
    parts = [{"type": "text", "text": "w5"}, {"type": "text", "text": "w6"}]
    [out] = chat_llm.chat([{"role": "user", "content": parts}], GREEDY, use_tqdm=False)
    assert out.prompt == "w5\nw6 w3" and out.prompt_token_ids == [5, 6, 3]


@pytest.mark.parametrize(
    "part, message",
    [
        (
            {"type": "image_url", "image_url": {"url": "http://x/cat.png"}},
            "part 1 is 'image_url': this is a text-only model",
        ),
        ({"text": "w6"}, "part 1 is a dict without a 'type': this is a text-only model"),
        ({"type": "text", "text": 6}, "part 1: a text part needs 'text' as a string"),
    ],
)
def test_chat_refuses_parts_that_are_not_text(chat_llm, part, message):
    conversation = [{"role": "user", "content": [{"type": "text", "text": "w5"}, part]}]
    with pytest.raises(ValueError, match=f"message 0, {message}"):
        chat_llm.chat(conversation, GREEDY, use_tqdm=False)


def test_chat_passes_tools_to_the_template(chat_llm):
    template = (
        "{% for tool in tools %}{{ tool['function']['name'] }} {% endfor %}"
        "{% for m in messages %}{{ m['content'] }} {% endfor %}w3"
    )
    tools = [{"type": "function", "function": {"name": "w7", "parameters": {"type": "object", "properties": {}}}}]
    [out] = chat_llm.chat(
        [{"role": "user", "content": "w5"}], GREEDY, chat_template=template, tools=tools, use_tqdm=False
    )
    assert out.prompt_token_ids == [7, 5, 3]
    with pytest.raises(ValueError, match="tools must be a list of OpenAI tool dicts"):
        chat_llm.chat([{"role": "user", "content": "w5"}], GREEDY, tools={"name": "w7"}, use_tqdm=False)


def test_logprobs_of_minus_one_are_the_whole_vocabulary(llm):
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=3, ignore_eos=True, logprobs=-1, prompt_logprobs=-1)
    [out] = llm.generate([5, 6, 7], params, use_tqdm=False)
    completion = out.outputs[0]
    assert out.prompt_logprobs[0] is None
    for position in [*completion.logprobs, *out.prompt_logprobs[1:]]:
        assert sorted(position) == list(range(VOCAB_SIZE))
        assert sorted(entry.rank for entry in position.values()) == list(range(1, VOCAB_SIZE + 1))
        assert math.fsum(math.exp(entry.logprob) for entry in position.values()) == pytest.approx(1.0, abs=1e-4)
    # the same draws as without logprobs, and the chosen token's entry is the one of the sampled token
    plain = llm.generate(
        [5, 6, 7], SamplingParams(temperature=1.0, seed=5, max_tokens=3, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    assert completion.token_ids == plain.token_ids
    assert completion.cumulative_logprob == pytest.approx(
        sum(position[token].logprob for position, token in zip(completion.logprobs, completion.token_ids))
    )
    with pytest.raises(ValueError, match="logprobs=513 asks for more alternatives than the vocabulary's 512"):
        llm.generate([5], SamplingParams(logprobs=VOCAB_SIZE + 1), use_tqdm=False)


@pytest.fixture
def script(monkeypatch):
    return scripted_replies(monkeypatch)


def test_chat_with_a_reasoning_parser_splits_each_reply_as_the_server_does(chat_llm, script):
    user = [{"role": "user", "content": "w5 w6"}]
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=script(["<think>", "Sum.", "</think>\n\n", "4"]))
    [plain] = chat_llm.chat(user, params, use_tqdm=False)
    assert (plain.outputs[0].reasoning_content, plain.outputs[0].text) == (None, "<think>Sum.</think>\n\n4")
    think_parsers = [p for p in REASONING_PARSERS if p not in READS_SPECIAL_TOKENS]
    for parser in think_parsers:
        [out] = chat_llm.chat(user, params, use_tqdm=False, reasoning_parser=parser)
        assert (out.outputs[0].reasoning_content, out.outputs[0].text) == ("Sum.", "4")
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=script(["Just ", "4"]))
    replies = {p: chat_llm.chat(user, params, use_tqdm=False, reasoning_parser=p)[0].outputs[0] for p in think_parsers}
    # deepseek_r1's template opens the reasoning in the prompt; qwen3 takes a reply with no </think> as all answer
    assert (replies["deepseek_r1"].reasoning_content, replies["deepseek_r1"].text) == ("Just 4", "")
    assert (replies["qwen3"].reasoning_content, replies["qwen3"].text) == (None, "Just 4")
    harmony = ["<|channel|>analysis<|message|>", "Sum.", "<|end|><|start|>assistant<|channel|>final<|message|>4"]
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=script(harmony))
    [out] = chat_llm.chat(user, params, use_tqdm=False, reasoning_parser="openai_gptoss")
    assert (out.outputs[0].reasoning_content, out.outputs[0].text) == ("Sum.", "4")
    assert params.skip_special_tokens  # the caller's params are left as they were


def test_chat_under_a_grammar_keeps_the_reply_whole(chat_llm, script):
    pytest.importorskip("xgrammar")
    user = [{"role": "user", "content": "w5 w6"}]
    constrained = SamplingParams(
        temperature=0,
        max_tokens=script(["Why?", "</think>", "So."]),
        structured_outputs=StructuredOutputsParams(choice=["w5 w6 w7"]),
    )
    [out] = chat_llm.chat(user, constrained, use_tqdm=False, reasoning_parser="deepseek_r1")
    # the grammar ends the reply early; what came of the script is left whole
    assert out.outputs[0].reasoning_content is None and out.outputs[0].text.startswith("Why?</think>")


def test_chat_refuses_an_unknown_reasoning_parser_by_name(chat_llm):
    with pytest.raises(
        ValueError, match="unknown reasoning_parser 'granite'; the parsers are deepseek_r1, openai_gptoss, qwen3"
    ):
        chat_llm.chat([{"role": "user", "content": "w5"}], GREEDY, use_tqdm=False, reasoning_parser="granite")
