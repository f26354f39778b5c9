"""TokenTexts: each token's text is what `tokenizer.decode([id])` gives, and each id is decoded once."""

from nanovllm.frontend.token_texts import TokenTexts

TEXT = " Héllo wörld! 東京は大きい 🙂🚀 naïve café — done."


class CountingTokenizer:
    """The real tokenizer's decode, counting the ids it is asked for."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoded: list[int] = []

    def decode(self, sequences):
        self.decoded += [token_id for sequence in sequences for token_id in sequence]
        return self.tokenizer.decode(sequences)


def test_texts_are_what_decoding_each_token_alone_gives(smollm_tokenizer):
    ids = smollm_tokenizer.encode(TEXT)
    # pieces of characters split across tokens, a special token, and repeats
    ids += [smollm_tokenizer.eos_token_id, ids[0], ids[1], ids[0]]
    assert any("\ufffd" in smollm_tokenizer.decode([token_id]) for token_id in ids)
    texts = TokenTexts(smollm_tokenizer)
    assert texts(ids) == [smollm_tokenizer.decode([token_id]) for token_id in ids]
    # again, now from what was kept, and with ids not seen before
    more = [smollm_tokenizer.bos_token_id or 0, *ids[:5], 1000, 1001]
    assert texts(more) == [smollm_tokenizer.decode([token_id]) for token_id in more]


def test_each_id_is_decoded_once(smollm_tokenizer):
    tokenizer = CountingTokenizer(smollm_tokenizer)
    texts = TokenTexts(tokenizer)
    texts([5, 6, 5, 7])
    assert sorted(tokenizer.decoded) == [5, 6, 7]
    assert texts([7, 6, 8, 5]) == [smollm_tokenizer.decode([t]) for t in (7, 6, 8, 5)]
    assert sorted(tokenizer.decoded) == [5, 6, 7, 8]


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_its_own_decode(smollm_tokenizer):
    tokenizer = CountingTokenizer(smollm_tokenizer)
    tokenizer.backend_tokenizer = smollm_tokenizer.backend_tokenizer  # a fast tokenizer ...
    tokenizer.clean_up_tokenization_spaces = True  # ... whose decode changes the backend's text
    assert TokenTexts(tokenizer)([5, 6]) == [smollm_tokenizer.decode([t]) for t in (5, 6)]
    assert sorted(tokenizer.decoded) == [5, 6]


def test_the_whole_vocabulary_is_decoded_in_the_background(smollm_tokenizer):
    texts = TokenTexts(smollm_tokenizer, vocab_size=len(smollm_tokenizer))
    assert texts.whole_vocabulary.wait(timeout=60)
    ids = smollm_tokenizer.encode(TEXT) + [smollm_tokenizer.eos_token_id, len(smollm_tokenizer) - 1]
    assert texts(ids) == [smollm_tokenizer.decode([token_id]) for token_id in ids]
