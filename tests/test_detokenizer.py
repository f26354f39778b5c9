"""Incremental detokenization: deltas add up to the decoded text and never split a character."""

from nanovllm.engine.detokenizer import IncrementalDetokenizer

TEXT = " Héllo wörld! 東京は大きい 🙂🚀 naïve café — done."


def stream(tokenizer, prompt_ids, completion_ids):
    """Every delta, feeding the completion one token at a time."""
    detok = IncrementalDetokenizer(tokenizer, len(prompt_ids))
    token_ids = list(prompt_ids)
    deltas = []
    for token_id in completion_ids:
        token_ids.append(token_id)
        deltas.append(detok.step(token_ids))
    return deltas


def test_deltas_add_up_to_the_text_after_the_prompt(smollm_tokenizer):
    prompt = smollm_tokenizer.encode("Say something:")
    completion = smollm_tokenizer.encode(TEXT)
    deltas = stream(smollm_tokenizer, prompt, completion)
    full = smollm_tokenizer.decode(prompt + completion)
    assert "".join(deltas) == full[len(smollm_tokenizer.decode(prompt)):] == TEXT


def test_split_characters_are_held_back_until_whole(smollm_tokenizer):
    completion = smollm_tokenizer.encode(TEXT)
    # the test needs characters whose bytes span several tokens
    assert any("\ufffd" in smollm_tokenizer.decode([t]) for t in completion)
    deltas = stream(smollm_tokenizer, smollm_tokenizer.encode("Hi"), completion)
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas


def test_an_unfinished_character_stays_out(smollm_tokenizer):
    prompt = smollm_tokenizer.encode("Hi")
    emoji = smollm_tokenizer.encode("🙂")
    assert len(emoji) > 1
    detok = IncrementalDetokenizer(smollm_tokenizer, len(prompt))
    assert detok.step(prompt + emoji[:1]) == ""
    assert detok.step(prompt + emoji) == "🙂"


def test_end_leaves_later_tokens_out(tiny_tokenizer):
    token_ids = tiny_tokenizer.encode("w5 w6 w7 w8 w9")
    detok = IncrementalDetokenizer(tiny_tokenizer, 3)
    assert detok.step(token_ids, end=4) == " w8"
    assert detok.step(token_ids) == " w9"


def test_special_tokens_are_skipped(tiny_tokenizer):
    token_ids = tiny_tokenizer.encode("w5 w6") + [tiny_tokenizer.eos_token_id]
    assert stream(tiny_tokenizer, token_ids[:1], token_ids[1:]) == [" w6", ""]


def test_a_skipped_special_token_mid_completion_keeps_the_next_word_apart(tiny_tokenizer):
    token_ids = tiny_tokenizer.encode("w5 w6") + [tiny_tokenizer.eos_token_id] + tiny_tokenizer.encode("w7 w8")
    deltas = stream(tiny_tokenizer, token_ids[:1], token_ids[1:])
    assert deltas == [" w6", "", " w7", " w8"]
    assert "".join(deltas) == tiny_tokenizer.decode(token_ids, skip_special_tokens=True)[len("w5"):]
