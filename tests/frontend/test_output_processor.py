"""The front end's output side: a completion's text rules (a stop token's text, stop strings across
tokens, min_tokens, what a stream may show so far and each delta), stop_reason, logprobs and prompt
logprobs; a user request's n completions and best_of ranking; each completion's settings; and
OutputProcessor's book-keeping of live requests."""

from nanovllm import SamplingParams
from nanovllm.engine.messages import EngineCoreOutput, TokenLogprobs
from nanovllm.frontend.engine_frontend import completion_params
from nanovllm.frontend.output_processor import OutputProcessor, ParentRequest, RequestState
from nanovllm.frontend.token_texts import TokenTexts
from nanovllm.outputs import Logprob

EOS = 1


def core_outputs(
    request_id: str, completion: list[int], last_reason: str | None, last_stop_reason: int | None = None
) -> list[EngineCoreOutput]:
    """One output per token, as the core sends them; the last one carries `last_reason` (None: still going)
    and `last_stop_reason`."""
    reasons = [None] * (len(completion) - 1) + [last_reason]
    stop_reasons = [None] * (len(completion) - 1) + [last_stop_reason]
    return [
        EngineCoreOutput(request_id, [token_id], finish_reason=reason, stop_reason=stop_reason)
        for token_id, reason, stop_reason in zip(completion, reasons, stop_reasons)
    ]


def make_parent(tokenizer, prompt: str, request_id="r", **params) -> ParentRequest:
    """A user request as the front end submits it: one RequestState per completion with that completion's
    own settings, under the core id `request_id` (one completion) or `{index}_{request_id}`."""
    params = SamplingParams(**params)
    prompt_token_ids = tokenizer.encode(prompt)
    single = params.num_completions == 1
    completions = [
        RequestState(
            request_id if single else f"{index}_{request_id}",
            index,
            prompt_token_ids,
            completion_params(params, index),
            tokenizer,
            show_logprobs=params.logprobs is not None,
            token_texts=TokenTexts(tokenizer),
        )
        for index in range(params.num_completions)
    ]
    return ParentRequest(request_id, prompt, prompt_token_ids, params, completions)


def make_state(tokenizer, prompt: str, **params) -> RequestState:
    """The one completion of a request "r"."""
    return make_parent(tokenizer, prompt, **params).completions[0]


def run(
    tokenizer, prompt: str, completion: list[int], last_reason="length", last_stop_reason=None, **params
) -> tuple[RequestState, list[str]]:
    """Feed `completion` through an OutputProcessor, one step per token; returns the request's state and
    the ids the processor asked the core to abort."""
    parent = make_parent(tokenizer, prompt, **params)
    processor = OutputProcessor()
    processor.add_request(parent)
    to_abort = []
    for output in core_outputs("r", completion, last_reason, last_stop_reason):
        to_abort += processor.process([output]).to_abort
    return parent.completions[0], to_abort


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


# ---- text and stopping ----


def test_a_stop_tokens_text_is_left_out_and_kept_with_include_stop_str_in_output(tiny_tokenizer):
    state, to_abort = run(tiny_tokenizer, "w5", [6, 9, 7], "stop", 7, stop_token_ids=[7])
    assert (state.text, state.finish_reason, state.token_ids) == (" w6 w9", "stop", [6, 9, 7])
    assert to_abort == []  # the core ended it itself
    state, _ = run(tiny_tokenizer, "w5", [6, 9, 7], "stop", 7, stop_token_ids=[7], include_stop_str_in_output=True)
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
    assert (state.text, state.stop_reason) == (" w", "6 w7 w8")


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


def test_stop_reason_is_the_stop_string_or_stop_token_and_none_for_eos_or_length(tiny_tokenizer):
    by_token, _ = run(tiny_tokenizer, "w5", [6, 7], "stop", 7, stop_token_ids=[7])
    by_eos, _ = run(tiny_tokenizer, "w5", [6, EOS], "stop", stop_token_ids=[7])
    by_length, _ = run(tiny_tokenizer, "w5", [6, 9], "length", stop="w7")
    # the core's last token also reached max_tokens, but the stop string it completes is the reason
    by_string, _ = run(tiny_tokenizer, "w5", [6, 7], "length", stop="w7")
    assert [(s.finish_reason, s.stop_reason) for s in (by_token, by_eos, by_length, by_string)] == [
        ("stop", 7),
        ("stop", None),
        ("length", None),
        ("stop", "w7"),
    ]
    completion = by_string.completion()
    assert (completion.finish_reason, completion.stop_reason, completion.text) == ("stop", "w7", " w6 ")


# ---- what a stream shows ----


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
    assert [d.index for d in deltas] == [0, 0, 0]
    again = state.delta()
    assert (again.token_ids, again.text) == ([], "")


# ---- logprobs ----


def test_logprobs_put_the_chosen_token_first_with_its_rank_then_the_alternatives_ranked_from_1(tiny_tokenizer):
    state = make_state(tiny_tokenizer, "w5", logprobs=2)
    # the chosen 6 is also the most likely token: it is listed once, and the next alternative is rank 2
    state.update(EngineCoreOutput("r", [6], [TokenLogprobs([6, 6, 9], [-0.25, -0.25, -1.5], 1)]))
    first = {6: Logprob(-0.25, 1, "w6"), 9: Logprob(-1.5, 2, "w9")}
    assert state.delta().logprobs == [first]
    # the chosen 9 is only the third most likely
    state.update(EngineCoreOutput("r", [9], [TokenLogprobs([9, 7, 8], [-2.0, -0.5, -1.0], 3)], "length"))
    second = {9: Logprob(-2.0, 3, "w9"), 7: Logprob(-0.5, 1, "w7"), 8: Logprob(-1.0, 2, "w8")}
    delta = state.delta()
    assert delta.logprobs == [second] and list(delta.logprobs[0]) == [9, 7, 8]
    completion = state.completion()
    assert completion.logprobs == [first, second]
    assert completion.cumulative_logprob == -0.25 + -2.0


def test_logprob_tokens_carry_the_text_of_each_token_decoded_alone(smollm_tokenizer):
    # byte-level tokens: pieces of split characters decode to U+FFFD; the end-of-sequence token shows its text
    text_ids = smollm_tokenizer.encode(" 東京 🙂 naïve")
    rows = [text_ids[i : i + 3] for i in range(0, len(text_ids) - 2, 2)] + [[smollm_tokenizer.eos_token_id, 0, 17]]
    state = make_state(smollm_tokenizer, "Say:", logprobs=2, prompt_logprobs=2)
    for row in rows:
        entry = TokenLogprobs(row, [-1.0, -0.5, -2.0], 2)
        state.update(EngineCoreOutput("r", row[:1], [entry], new_prompt_logprobs=[entry]))
    expected = [{token_id: smollm_tokenizer.decode([token_id]) for token_id in row} for row in rows]
    shown = [
        {token_id: lp.decoded_token for token_id, lp in position.items()} for position in state.completion().logprobs
    ]
    assert shown == expected
    assert [{t: lp.decoded_token for t, lp in position.items()} for position in state.prompt_logprobs[1:]] == expected
    # without a tokenizer the tokens have no text
    bare = RequestState("r", 0, [5], SamplingParams(logprobs=2), None, show_logprobs=True, token_texts=None)
    bare.update(EngineCoreOutput("r", rows[0][:1], [TokenLogprobs(rows[0], [-1.0, -0.5, -2.0], 2)]))
    assert [lp.decoded_token for lp in bare.completion().logprobs[0].values()] == [None] * 3


def test_logprobs_computed_for_ranking_only_keep_the_cumulative_sum_but_show_no_positions(tiny_tokenizer):
    state = RequestState(
        "r",
        0,
        [5],
        SamplingParams(logprobs=0),
        tiny_tokenizer,
        show_logprobs=False,
        token_texts=TokenTexts(tiny_tokenizer),
    )
    state.update(EngineCoreOutput("r", [6], [TokenLogprobs([6], [-0.75], 2)]))
    state.update(EngineCoreOutput("r", [7], [TokenLogprobs([7], [-0.5], 1)]))
    completion = state.completion()
    assert (completion.logprobs, completion.cumulative_logprob) == (None, -1.25)
    assert state.delta().logprobs is None
    # nothing computed at all: no sum either
    plain = RequestState(
        "r", 0, [5], SamplingParams(), tiny_tokenizer, show_logprobs=False, token_texts=TokenTexts(tiny_tokenizer)
    )
    plain.update(EngineCoreOutput("r", [6]))
    assert (plain.completion().logprobs, plain.completion().cumulative_logprob) == (None, None)


def test_prompt_logprobs_are_none_for_the_first_token_then_gather_positions_across_outputs(tiny_tokenizer):
    state = make_state(tiny_tokenizer, "w5 w6 w7 w8", prompt_logprobs=1)
    assert state.prompt_logprobs == [None]
    # a prompt chunk scores the positions before w6 and w7 without sampling; the last chunk the one before w8
    state.update(
        EngineCoreOutput(
            "r",
            [],
            new_prompt_logprobs=[TokenLogprobs([6, 2], [-1.0, -0.5], 2), TokenLogprobs([7, 7], [-0.5, -0.5], 1)],
        )
    )
    assert state.token_ids == [] and not state.finished
    state.update(EngineCoreOutput("r", [9], new_prompt_logprobs=[TokenLogprobs([8, 3], [-3.0, -0.125], 4)]))
    assert state.prompt_logprobs == [
        None,
        {6: Logprob(-1.0, 2, "w6"), 2: Logprob(-0.5, 1, "w2")},
        {7: Logprob(-0.5, 1, "w7")},
        {8: Logprob(-3.0, 4, "w8"), 3: Logprob(-0.125, 1, "w3")},
    ]
    assert state.token_ids == [9]


# ---- a user request's completions ----


def test_n_3_gives_three_completions_indexed_0_to_2_finished_only_when_all_are(tiny_tokenizer):
    parent = make_parent(tiny_tokenizer, "w5", n=3)
    processor = OutputProcessor()
    processor.add_request(parent)
    processed = processor.process([EngineCoreOutput(f"{index}_r", [6 + index]) for index in range(3)])
    assert processed.updated == [parent]
    output = parent.output()
    assert [(c.index, c.text, c.token_ids) for c in output.outputs] == [
        (0, " w6", [6]),
        (1, " w7", [7]),
        (2, " w8", [8]),
    ]
    assert (output.request_id, output.prompt, output.prompt_token_ids) == ("r", "w5", [5])
    processor.process(
        [EngineCoreOutput("0_r", [9], finish_reason="length"), EngineCoreOutput("2_r", [9], finish_reason="length")]
    )
    output = parent.output()
    assert [c.finish_reason for c in output.outputs] == ["length", None, "length"]
    assert not output.finished and processor.has_unfinished_requests()
    processor.process([EngineCoreOutput("1_r", [9], finish_reason="length")])
    assert parent.output().finished and not processor.has_unfinished_requests()


def test_a_requests_delta_carries_only_the_completions_that_changed_and_the_prompt_logprobs_once(tiny_tokenizer):
    parent = make_parent(tiny_tokenizer, "w5 w6", n=2, prompt_logprobs=0)
    processor = OutputProcessor()
    processor.add_request(parent)
    # the first completion asks for the prompt's logprobs: the position before w6
    processor.process([EngineCoreOutput("0_r", [7], new_prompt_logprobs=[TokenLogprobs([6], [-1.0], 3)])])
    delta = parent.delta()
    assert [(c.index, c.token_ids) for c in delta.outputs] == [(0, [7])]
    assert delta.prompt_logprobs == [None, {6: Logprob(-1.0, 3, "w6")}]
    processor.process([EngineCoreOutput("1_r", [8])])
    delta = parent.delta()
    assert [(c.index, c.token_ids, c.text) for c in delta.outputs] == [(1, [8], " w8")]
    assert delta.prompt_logprobs is None
    assert parent.delta() is None  # nothing new since
    processor.process([EngineCoreOutput("0_r", [9], finish_reason="length")])
    delta = parent.delta()
    assert [(c.index, c.token_ids, c.finish_reason) for c in delta.outputs] == [(0, [9], "length")]
    assert not delta.finished
    # the whole output still has the prompt logprobs
    assert parent.output().prompt_logprobs == [None, {6: Logprob(-1.0, 3, "w6")}]


def test_a_completion_that_finished_is_not_repeated_in_later_deltas(tiny_tokenizer):
    parent = make_parent(tiny_tokenizer, "w5", n=2)
    processor = OutputProcessor()
    processor.add_request(parent)
    processor.process([EngineCoreOutput("0_r", [6], finish_reason="length"), EngineCoreOutput("1_r", [7])])
    assert [c.index for c in parent.delta().outputs] == [0, 1]
    # the first completion's end went out with that delta; only the second one changes now
    processor.process([EngineCoreOutput("1_r", [8])])
    assert [(c.index, c.token_ids) for c in parent.delta().outputs] == [(1, [8])]
    assert parent.delta() is None


def test_best_of_shows_nothing_until_all_finish_then_the_n_most_likely_renumbered(tiny_tokenizer):
    parent = make_parent(tiny_tokenizer, "w5", n=2, best_of=4)
    processor = OutputProcessor()
    processor.add_request(parent)
    # per completion: its token and the chosen logprob of each of its two steps. Sums: -3.125, -1.0, -0.5,
    # -4.125: completion 2, then 1, are best, though 0 leads after the first step and 3 gains most in the second.
    steps = {
        "0_r": (6, [-0.125, -3.0]),
        "1_r": (7, [-0.5, -0.5]),
        "2_r": (8, [-0.25, -0.25]),
        "3_r": (9, [-4.0, -0.125]),
    }

    def output(core_id: str, step: int) -> EngineCoreOutput:
        token_id, logprobs = steps[core_id]
        return EngineCoreOutput(
            core_id,
            [token_id],
            [TokenLogprobs([token_id], [logprobs[step]], 1)],
            finish_reason="length" if step == 1 else None,
        )

    processor.process([output(core_id, 0) for core_id in steps])
    assert parent.delta() is None
    processor.process([output(core_id, 1) for core_id in ("0_r", "1_r", "2_r")])
    assert parent.delta() is None
    processor.process([output("3_r", 1)])
    delta = parent.delta()
    assert delta.finished
    assert [(c.index, c.token_ids, c.text, c.cumulative_logprob) for c in delta.outputs] == [
        (0, [8, 8], " w8 w8", -0.5),
        (1, [7, 7], " w7 w7", -1.0),
    ]
    # logprobs were computed for the ranking, not asked for
    assert [c.logprobs for c in delta.outputs] == [None, None]
    assert parent.output().outputs == delta.outputs


def test_completion_params_seed_each_completion_and_give_prompt_logprobs_to_the_first_only():
    params = SamplingParams(n=3, seed=10, logprobs=2, prompt_logprobs=1)
    each = [completion_params(params, index) for index in range(3)]
    assert [p.seed for p in each] == [10, 11, 12]
    assert [p.prompt_logprobs for p in each] == [1, None, None]
    assert [(p.n, p.best_of, p.num_completions, p.logprobs) for p in each] == [(1, None, 1, 2)] * 3
    assert params.n == 3 and params.seed == 10  # the request's own settings are unchanged
    unseeded = SamplingParams(n=2)
    assert [completion_params(unseeded, index).seed for index in range(2)] == [None, None]


def test_completion_params_compute_logprobs_for_a_best_of_ranking_only():
    ranked = SamplingParams(n=1, best_of=3)
    assert [completion_params(ranked, index).logprobs for index in range(3)] == [0, 0, 0]
    # logprobs the user asked for are kept as they are
    assert completion_params(SamplingParams(n=1, best_of=3, logprobs=4), 1).logprobs == 4
    # best_of == n ranks nothing
    assert completion_params(SamplingParams(n=2, best_of=2), 1).logprobs is None


def test_completion_params_pass_a_single_completions_settings_through():
    params = SamplingParams(seed=7, prompt_logprobs=3)
    assert completion_params(params, 0) is params
    one_of_one = SamplingParams(n=1, best_of=1)
    assert completion_params(one_of_one, 0) is one_of_one


# ---- OutputProcessor ----


def test_a_stop_string_puts_the_completions_core_id_in_to_abort_and_ends_it(tiny_tokenizer):
    parent = make_parent(tiny_tokenizer, "w5", n=2, stop="w6")
    processor = OutputProcessor()
    processor.add_request(parent)
    processed = processor.process([EngineCoreOutput("0_r", [7]), EngineCoreOutput("1_r", [6])])
    assert processed.updated == [parent] and processed.to_abort == ["1_r"]
    first, second = parent.completions
    assert (second.finish_reason, second.stop_reason, second.text) == ("stop", "w6", " ")
    assert not first.finished and processor.has_unfinished_requests()
    # a token the core sampled before it dropped the completion is ignored
    assert processor.process([EngineCoreOutput("1_r", [8])]).updated == []
    assert second.token_ids == [6]


def test_outputs_of_unknown_or_finished_requests_are_dropped(tiny_tokenizer):
    processor = OutputProcessor()
    a, b = (make_parent(tiny_tokenizer, "w5", request_id=request_id) for request_id in ("a", "b"))
    processor.add_request(a)
    processor.add_request(b)
    processed = processor.process(
        core_outputs("a", [6], "length") + core_outputs("unknown", [7], None) + core_outputs("b", [8], None)
    )
    assert processed.updated == [a, b] and processed.to_abort == []
    assert list(processor.parents) == ["b"]
    # a step launched before "a" finished still brings it a token
    processed = processor.process(core_outputs("a", [9], None) + core_outputs("b", [10], None))
    assert processed.updated == [b]
    (a_state,), (b_state,) = a.completions, b.completions
    assert (a_state.token_ids, a_state.text, b_state.token_ids) == ([6], " w6", [8, 10])


def test_finish_abort_ends_a_live_request_once_and_drops_only_its_unfinished_completions(tiny_tokenizer):
    processor = OutputProcessor()
    parent = make_parent(tiny_tokenizer, "w5", n=2)
    processor.add_request(parent)
    processor.process([EngineCoreOutput("0_r", [6], finish_reason="length"), EngineCoreOutput("1_r", [7])])
    assert processor.finish("r", "abort") == (parent, ["1_r"])
    assert [c.finish_reason for c in parent.completions] == ["length", "abort"]
    assert parent.output().finished and not processor.has_unfinished_requests()
    assert processor.finish("r", "abort") == (None, [])
    assert processor.process([EngineCoreOutput("1_r", [8])]).updated == []
    assert parent.completions[1].token_ids == [7]
