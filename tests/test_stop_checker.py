"""Stopping rules: stop strings across tokens, stop tokens, min_tokens, max_tokens and finish_reason."""

from nanovllm import SamplingParams
from nanovllm.engine.detokenizer import IncrementalDetokenizer
from nanovllm.engine.sequence import Sequence, SequenceStatus
from nanovllm.engine.stop_checker import StopChecker

EOS = 1


def run(tokenizer, prompt: str, completion: list[int], max_model_len=1000, **params) -> Sequence:
    """Feed `completion` token by token until the checker finishes the sequence."""
    prompt_ids = tokenizer.encode(prompt)
    params = SamplingParams(temperature=0, **params)
    seq = Sequence(prompt_ids, params, 16, IncrementalDetokenizer(tokenizer, len(prompt_ids)))
    checker = StopChecker(frozenset({EOS}), max_model_len)
    for token_id in completion:
        seq.append_token(token_id)
        checker.update(seq)
        if seq.finish_reason:
            break
    return seq


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def test_runs_to_max_tokens_with_reason_length(tiny_tokenizer):
    seq = run(tiny_tokenizer, "w5", ids(tiny_tokenizer, "w6 w7 w8 w9"), max_tokens=3)
    assert (seq.output_text, seq.finish_reason, seq.num_completion_tokens) == (" w6 w7 w8", "length", 3)


def test_max_model_len_ends_with_reason_length(tiny_tokenizer):
    seq = run(tiny_tokenizer, "w5 w6", ids(tiny_tokenizer, "w7 w8 w9"), max_model_len=4)
    assert (seq.output_text, seq.finish_reason) == (" w7 w8", "length")


def test_eos_stops_and_its_text_is_left_out(tiny_tokenizer):
    seq = run(tiny_tokenizer, "w5", ids(tiny_tokenizer, "w6") + [EOS, 7])
    assert (seq.output_text, seq.finish_reason, seq.completion_token_ids) == (" w6", "stop", [6, EOS])


def test_ignore_eos_runs_past_it(tiny_tokenizer):
    seq = run(tiny_tokenizer, "w5", [6, EOS, 7], ignore_eos=True, max_tokens=3)
    assert seq.finish_reason == "length" and seq.completion_token_ids == [6, EOS, 7]


def test_stop_token_ids_stop_and_include_stop_str_keeps_their_text(tiny_tokenizer):
    seq = run(tiny_tokenizer, "w5", [6, 9, 7, 8], stop_token_ids=[7])
    assert (seq.output_text, seq.finish_reason, seq.completion_token_ids) == (" w6 w9", "stop", [6, 9, 7])
    seq = run(tiny_tokenizer, "w5", [6, 9, 7, 8], stop_token_ids=[7], include_stop_str_in_output=True)
    assert seq.output_text == " w6 w9 w7"


def test_stop_string_spanning_tokens_cuts_the_text_before_it(tiny_tokenizer):
    completion = ids(tiny_tokenizer, "w6 w7 w8 w9 w10")
    seq = run(tiny_tokenizer, "w5", completion, stop=["w8 w9", "w100"])
    assert (seq.output_text, seq.finish_reason) == (" w6 w7 ", "stop")
    assert seq.completion_token_ids == completion[:4]  # the tokens that completed the stop string stay
    seq = run(tiny_tokenizer, "w5", completion, stop="w8 w9", include_stop_str_in_output=True)
    assert seq.output_text == " w6 w7 w8 w9"


def test_earliest_stop_string_wins(tiny_tokenizer):
    seq = run(tiny_tokenizer, "w5", ids(tiny_tokenizer, "w6 w7 w8"), stop=["w7 w8", "6 w7"])
    assert seq.output_text == " w"


def test_stop_string_inside_a_token_of_byte_level_text(smollm_tokenizer):
    completion = ids(smollm_tokenizer, " Hello world, again and again.")
    seq = run(smollm_tokenizer, "Say:", completion, stop="lo wor")
    assert (seq.output_text, seq.finish_reason) == (" Hel", "stop")
    assert seq.num_completion_tokens < len(completion)


def test_min_tokens_defers_every_kind_of_stop(tiny_tokenizer):
    seq = run(tiny_tokenizer, "w5", [EOS, 7, 9, 10, 11], min_tokens=3, stop_token_ids=[7], stop="w7", max_tokens=5)
    assert seq.finish_reason == "length"
    seq = run(tiny_tokenizer, "w5", [8, 9, 8, 10], min_tokens=3, stop="w8")
    assert (seq.output_text, seq.finish_reason) == (" w8 w9 ", "stop")


def test_stream_text_holds_back_a_possible_stop_string_start(tiny_tokenizer):
    seq = run(tiny_tokenizer, "w5", [6, 7], stop="w7 w9", max_tokens=8)
    assert seq.finish_reason is None
    assert seq.output_text == " w6 w7" and seq.stream_text == " w"
    seq.status = SequenceStatus.FINISHED
    assert seq.stream_text == seq.output_text
