"""The front end's text rules: a stop token's text, stop strings across tokens, min_tokens, what a
stream may show so far and each delta; and OutputProcessor's book-keeping of live requests."""

from nanovllm import SamplingParams
from nanovllm.engine.messages import EngineCoreOutput
from nanovllm.frontend.output_processor import OutputProcessor, RequestState

EOS = 1


def core_outputs(request_id: str, completion: list[int], last_reason: str | None) -> list[EngineCoreOutput]:
    """One output per token, as the core sends them; the last one carries `last_reason` (None: still going)."""
    reasons = [None] * (len(completion) - 1) + [last_reason]
    return [EngineCoreOutput(request_id, [token_id], finish_reason=reason)
            for token_id, reason in zip(completion, reasons)]


def make_state(tokenizer, prompt: str, request_id="r", **params) -> RequestState:
    return RequestState(request_id, tokenizer.encode(prompt), SamplingParams(temperature=0, **params), tokenizer)


def run(tokenizer, prompt: str, completion: list[int], last_reason="length",
        **params) -> tuple[RequestState, list[str]]:
    """Feed `completion` through an OutputProcessor, one step per token; returns the request's state and
    the ids the processor asked the core to abort."""
    state = make_state(tokenizer, prompt, **params)
    processor = OutputProcessor()
    processor.add_request(state)
    to_abort = []
    for output in core_outputs(state.request_id, completion, last_reason):
        to_abort += processor.process([output]).to_abort
    return state, to_abort


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def test_a_stop_tokens_text_is_left_out_and_kept_with_include_stop_str_in_output(tiny_tokenizer):
    state, to_abort = run(tiny_tokenizer, "w5", [6, 9, 7], "stop", stop_token_ids=[7])
    assert (state.text, state.finish_reason, state.token_ids) == (" w6 w9", "stop", [6, 9, 7])
    assert to_abort == []  # the core ended it itself
    state, _ = run(tiny_tokenizer, "w5", [6, 9, 7], "stop", stop_token_ids=[7], include_stop_str_in_output=True)
    assert state.text == " w6 w9 w7"


def test_an_eos_tokens_text_is_left_out_even_where_special_tokens_are_shown(tiny_tokenizer):
    state, _ = run(tiny_tokenizer, "w5", [6, EOS], "stop", skip_special_tokens=False)
    assert (state.text, state.token_ids) == (" w6", [6, EOS])
    state, _ = run(tiny_tokenizer, "w5", [6, EOS], "stop", skip_special_tokens=False, include_stop_str_in_output=True)
    assert state.text == " w6 " + tiny_tokenizer.eos_token


def test_a_stop_string_spanning_tokens_cuts_the_text_before_it(tiny_tokenizer):
    completion = ids(tiny_tokenizer, "w6 w7 w8 w9 w10")
    state, to_abort = run(tiny_tokenizer, "w5", completion, stop=["w8 w9", "w100"])
    assert (state.text, state.finish_reason) == (" w6 w7 ", "stop")
    assert state.token_ids == completion[:4]  # the tokens that completed the stop string stay
    assert to_abort == ["r"]
    state, _ = run(tiny_tokenizer, "w5", completion, stop="w8 w9", include_stop_str_in_output=True)
    assert (state.text, state.token_ids) == (" w6 w7 w8 w9", completion[:4])


def test_the_earliest_stop_string_wins(tiny_tokenizer):
    # the token w8 completes both; "6 w7 w8" starts first
    state, _ = run(tiny_tokenizer, "w5", ids(tiny_tokenizer, "w6 w7 w8"), stop=["w7 w8", "6 w7 w8"])
    assert state.text == " w"


def test_a_stop_string_inside_a_token_of_byte_level_text(smollm_tokenizer):
    completion = ids(smollm_tokenizer, " Hello world, again and again.")
    stop = "lo wor"
    # the first tokens whose text holds the stop string; it ends inside the last of them
    n = next(n for n in range(1, len(completion) + 1) if stop in smollm_tokenizer.decode(completion[:n]))
    assert not smollm_tokenizer.decode(completion[:n]).endswith(stop)
    state, to_abort = run(smollm_tokenizer, "Say:", completion, stop=stop)
    assert (state.text, state.finish_reason, to_abort) == (" Hel", "stop", ["r"])
    assert state.token_ids == completion[:n] and n < len(completion)


def test_min_tokens_defers_stop_strings(tiny_tokenizer):
    # "w7" is complete at the first token, before min_tokens, and is not looked for again later
    state, to_abort = run(tiny_tokenizer, "w5", [7, 9, 10, 11], min_tokens=3, stop="w7")
    assert (state.text, state.finish_reason, to_abort) == (" w7 w9 w10 w11", "length", [])
    # the second "w8" comes at the third token and stops
    state, to_abort = run(tiny_tokenizer, "w5", [8, 9, 8, 10], min_tokens=3, stop="w8")
    assert (state.text, state.finish_reason, state.token_ids, to_abort) == (" w8 w9 ", "stop", [8, 9, 8], ["r"])


def test_stream_text_holds_back_a_possible_stop_string_start_and_shows_all_once_finished(tiny_tokenizer):
    stop = "w7 w9"
    state, _ = run(tiny_tokenizer, "w5", [6, 7], None, stop=stop)
    assert state.finish_reason is None
    # the last len(stop) - 1 characters might begin the stop string
    assert state.text == " w6 w7" and state.stream_text == state.text[: -(len(stop) - 1)] == " w"
    state.update(EngineCoreOutput("r", [10], finish_reason="length"))
    assert state.stream_text == state.text == " w6 w7 w10"


def test_without_stop_strings_stream_text_holds_nothing_back(tiny_tokenizer):
    state, _ = run(tiny_tokenizer, "w5", [6, 7], None)
    assert state.stream_text == state.text == " w6 w7"


def test_delta_returns_only_what_is_new_since_the_previous_delta(tiny_tokenizer):
    state = make_state(tiny_tokenizer, "w5", stop="w7 w9")
    deltas = []
    for output in core_outputs("r", [6, 7, 10], "length"):
        state.update(output)
        deltas.append(state.delta())
    assert [d.token_ids for d in deltas] == [[6], [7], [10]]
    # the text trails by what might start the stop string, then catches up at the end
    assert [d.text for d in deltas] == ["", " w", "6 w7 w10"]
    assert [d.finish_reason for d in deltas] == [None, None, "length"]
    assert [(d.num_prompt_tokens, d.num_completion_tokens) for d in deltas] == [(1, 1), (1, 2), (1, 3)]
    again = state.delta()
    assert (again.token_ids, again.text) == ([], "")


def test_a_stop_string_puts_the_request_in_to_abort_and_ends_it(tiny_tokenizer):
    processor = OutputProcessor()
    state = make_state(tiny_tokenizer, "w5", stop="w6")
    processor.add_request(state)
    processed = processor.process(core_outputs("r", [6], None))
    assert processed.updated == [state] and processed.to_abort == ["r"]
    assert state.finished and not processor.has_unfinished_requests()


def test_outputs_of_unknown_or_finished_requests_are_dropped(tiny_tokenizer):
    processor = OutputProcessor()
    a, b = (make_state(tiny_tokenizer, "w5", request_id=request_id) for request_id in ("a", "b"))
    processor.add_request(a)
    processor.add_request(b)
    processed = processor.process(core_outputs("a", [6], "length") + core_outputs("unknown", [7], None)
                                  + core_outputs("b", [8], None))
    assert processed.updated == [a, b] and processed.to_abort == []
    assert list(processor.requests) == ["b"]
    # a step launched before "a" finished still brings it a token
    processed = processor.process(core_outputs("a", [9], None) + core_outputs("b", [10], None))
    assert processed.updated == [b]
    assert (a.token_ids, a.text, b.token_ids) == ([6], " w6", [8, 10])


def test_finish_abort_ends_a_live_request_once(tiny_tokenizer):
    processor = OutputProcessor()
    state = make_state(tiny_tokenizer, "w5")
    processor.add_request(state)
    processor.process(core_outputs("r", [6], None))
    assert processor.finish("r", "abort") is state
    assert state.finish_reason == "abort" and not processor.has_unfinished_requests()
    assert processor.finish("r", "abort") is None
    assert processor.process(core_outputs("r", [7], None)).updated == []
    assert state.token_ids == [6]
