"""Harmony replies read by token ids, with a byte-level tokenizer whose vocabulary holds the tags as special
tokens (as gpt-oss's does): only those ids are tags; the same text spelled in plain tokens is content."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from nanovllm.entrypoints.harmony import TAGS, HarmonyReasoningStream, harmony_tag_ids
from nanovllm.entrypoints.reasoning import split_reasoning


def byte_tokenizer(special: tuple[str, ...]) -> PreTrainedTokenizerFast:
    """A tokenizer of one token per byte, with `special` added as special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"additional_special_tokens": list(special)})
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer(TAGS)


def reply_ids(tokenizer, pieces: list[str]) -> list[int]:
    """Token ids of a reply: each piece that is a tag as its special token, the others byte by byte (a tag's
    text inside a plain piece stays plain bytes)."""
    ids = []
    for piece in pieces:
        if piece in TAGS:
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        else:
            ids += [
                tokenizer.convert_tokens_to_ids(c)
                for c in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(piece)[0][0]
            ]
    return ids


# the analysis explains the format, spelling two tags in plain text; the final answer quotes one
PIECES = [
    "<|channel|>",
    "analysis",
    "<|message|>",
    "A message ends at <|end|>, then <|start|> opens one.",
    "<|end|>",
    "<|start|>",
    "assistant",
    "<|channel|>",
    "final",
    "<|message|>",
    "Use <|end|> to end it.",
    "<|return|>",
]
WANT = ("A message ends at <|end|>, then <|start|> opens one.", "Use <|end|> to end it.")


def test_the_tags_are_read_by_id_and_their_plain_spelling_is_content(tokenizer):
    ids = reply_ids(tokenizer, PIECES)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == "".join(PIECES)  # the text alone cannot tell the plain tags from the real ones
    assert split_reasoning(text, "openai_gptoss", ids, tokenizer) == WANT
    assert split_reasoning(text, "openai_gptoss") != WANT  # read from the text, a plain <|end|> ends a message


@pytest.mark.parametrize("step", [1, 2, 7])
def test_streamed_ids_give_the_whole_split(tokenizer, step):
    ids = reply_ids(tokenizer, PIECES)
    stream = HarmonyReasoningStream(tokenizer)
    reasoning, answer = "", ""
    for start in range(0, len(ids), step):
        more_reasoning, more_answer = stream.feed("", ids[start : start + step])
        reasoning, answer = reasoning + more_reasoning, answer + more_answer
    rest_reasoning, rest_answer = stream.finish()
    assert (reasoning + rest_reasoning, answer + rest_answer) == WANT


def test_a_plain_tag_split_between_two_tokens_stays_content(tokenizer):
    # "<" and "|" are separate byte tokens: the escape must see across them
    ids = reply_ids(tokenizer, ["<|channel|>", "final", "<|message|>", "a <|call|> b"])
    assert split_reasoning("", "openai_gptoss", ids, tokenizer) == (None, "a <|call|> b")


def test_a_vocabulary_without_the_tags_is_read_from_the_text():
    plain = byte_tokenizer(())
    assert harmony_tag_ids(plain) is None
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done."
    assert split_reasoning(text, "openai_gptoss", [], plain) == ("Think.", "Done.")
