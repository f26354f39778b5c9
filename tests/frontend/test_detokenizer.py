"""Incremental detokenization: deltas add up to the decoded text and never split a character."""

from nanovllm.frontend.detokenizer import IncrementalDetokenizer

TEXT = " Héllo wörld! 東京は大きい 🙂🚀 naïve café — done."
INCOMPLETE = "\ufffd"


def stream(tokenizer, prompt_ids, completion_ids):
    """Every delta, feeding the completion one token at a time."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    return [detok.step([token_id]) for token_id in completion_ids]


def test_deltas_add_up_to_the_text_after_the_prompt(smollm_tokenizer):
    prompt = smollm_tokenizer.encode("Say something:")
    completion = smollm_tokenizer.encode(TEXT)
    deltas = stream(smollm_tokenizer, prompt, completion)
    full = smollm_tokenizer.decode(prompt + completion)
    assert "".join(deltas) == full[len(smollm_tokenizer.decode(prompt)) :] == TEXT


def test_split_characters_are_held_back_until_whole(smollm_tokenizer):
    completion = smollm_tokenizer.encode(TEXT)
    # the test needs characters whose bytes span several tokens
    assert any(INCOMPLETE in smollm_tokenizer.decode([t]) for t in completion)
    deltas = stream(smollm_tokenizer, smollm_tokenizer.encode("Hi"), completion)
    assert not any(INCOMPLETE in d for d in deltas)
    assert "" in deltas


def test_an_unfinished_character_stays_out(smollm_tokenizer):
    emoji = smollm_tokenizer.encode("🙂")
    assert len(emoji) > 1
    detok = IncrementalDetokenizer(smollm_tokenizer, smollm_tokenizer.encode("Hi"))
    assert detok.step(emoji[:1]) == ""
    assert detok.step(emoji[1:]) == "🙂"


def test_several_tokens_in_one_step_give_their_text_at_once(smollm_tokenizer):
    prompt = smollm_tokenizer.encode("Say something:")
    completion = smollm_tokenizer.encode(TEXT)
    assert IncrementalDetokenizer(smollm_tokenizer, prompt).step(completion) == TEXT
    # steps of three tokens, some of them ending inside a character, whose bytes wait for the next step
    starts = range(0, len(completion), 3)
    assert any(smollm_tokenizer.decode(completion[:i]).endswith(INCOMPLETE) for i in starts)
    detok = IncrementalDetokenizer(smollm_tokenizer, prompt)
    deltas = [detok.step(completion[i : i + 3]) for i in starts]
    assert "".join(deltas) == TEXT
    assert not any(INCOMPLETE in d for d in deltas)


def test_the_text_of_tokens_left_out_is_never_produced(tiny_tokenizer):
    w5, w6, w7, w8 = tiny_tokenizer.encode("w5 w6 w7 w8")
    detok = IncrementalDetokenizer(tiny_tokenizer, [w5])
    # w7 is never passed (as a stop token's text is not), and a step with no tokens adds nothing
    assert [detok.step([w6]), detok.step([]), detok.step([w8])] == [" w6", "", " w8"]


def test_special_tokens_are_skipped(tiny_tokenizer):
    token_ids = tiny_tokenizer.encode("w5 w6") + [tiny_tokenizer.eos_token_id]
    assert stream(tiny_tokenizer, token_ids[:1], token_ids[1:]) == [" w6", ""]


def test_a_skipped_special_token_mid_completion_keeps_the_next_word_apart(tiny_tokenizer):
    token_ids = tiny_tokenizer.encode("w5 w6") + [tiny_tokenizer.eos_token_id] + tiny_tokenizer.encode("w7 w8")
    deltas = stream(tiny_tokenizer, token_ids[:1], token_ids[1:])
    assert deltas == [" w6", "", " w7", " w8"]
    assert "".join(deltas) == tiny_tokenizer.decode(token_ids, skip_special_tokens=True)[len("w5") :]


def test_a_character_the_prompt_starts_comes_out_whole_without_prompt_text(smollm_tokenizer):
    emoji = smollm_tokenizer.encode("🙂")
    assert len(emoji) > 1
    detok = IncrementalDetokenizer(smollm_tokenizer, smollm_tokenizer.encode("Hi") + emoji[:1])
    assert detok.step(emoji[1:]) + detok.step(smollm_tokenizer.encode(" ok")) == "🙂 ok"


def test_a_completion_that_does_not_finish_the_prompts_character_leaves_its_bytes_out(smollm_tokenizer):
    emoji = smollm_tokenizer.encode("🙂")
    brace = smollm_tokenizer.encode("{")
    assert smollm_tokenizer.decode(emoji[:1] + brace).startswith(INCOMPLETE)  # what the bytes would add
    detok = IncrementalDetokenizer(smollm_tokenizer, smollm_tokenizer.encode("Hi") + emoji[:1])
    assert detok.step(brace) + detok.step(smollm_tokenizer.encode('"a": 1}')) == '{"a": 1}'
