"""Grammar-constrained decoding on the bundled SmolLM2 (real weights, a byte-level BPE vocabulary): sampled
JSON that validates against a nested schema, regex and choice constraints, unconstrained neighbours
unchanged, length limits, bad specs refused, and the order in which a constrained step is launched."""

import json
import re

import jsonschema
import pytest

from nanovllm import LLM, SamplingParams, StructuredOutputsParams
from nanovllm.core.structured_output import grammar_of

from helpers.engine_probes import record_order

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "height": {"type": "number", "minimum": 0, "maximum": 3},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "height", "role", "tags", "address"],
    "additionalProperties": False,
}
PROMPT = "Describe a person as a JSON object:"


@pytest.fixture(scope="module")
def llm(smollm_dir):
    return LLM(smollm_dir, max_model_len=512)


def constrained(spec: StructuredOutputsParams, **params) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "max_tokens": 200, **params}, structured_outputs=spec)


@pytest.mark.slow
def test_fifty_sampled_completions_follow_a_nested_json_schema(llm):
    params = constrained(StructuredOutputsParams(json=SCHEMA), n=50, seed=0)
    [out] = llm.generate(PROMPT, params, use_tqdm=False)
    assert len(out.outputs) == 50
    for completion in out.outputs:
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), SCHEMA)
    assert len({c.text for c in out.outputs}) > 40  # sampled, not one answer fifty times


@pytest.mark.slow
def test_regex_and_choice_hold_under_sampling(llm):
    regex = StructuredOutputsParams(regex=r"[A-Z][a-z]{2,8} \d{3}-\d{4}")
    for completion in llm.generate("Name and phone:", constrained(regex, n=20, seed=1), use_tqdm=False)[0].outputs:
        assert re.fullmatch(regex.regex, completion.text), completion.text
    choice = StructuredOutputsParams(choice=["red", "green", "light blue"])
    colours = [c.text for c in llm.generate("A colour:", constrained(choice, n=30, seed=2), use_tqdm=False)[0].outputs]
    assert set(colours) <= {"red", "green", "light blue"} and len(set(colours)) > 1


@pytest.mark.slow
def test_any_json_object_and_an_ebnf_grammar(llm):
    [obj] = llm.generate(
        PROMPT, constrained(StructuredOutputsParams(json_object=True), seed=3, max_tokens=300), use_tqdm=False
    )[0].outputs
    assert obj.finish_reason == "length" or isinstance(json.loads(obj.text), dict)
    grammar = StructuredOutputsParams(grammar='root ::= "yes" | "no" | "maybe " [0-9]')
    answers = [c.text for c in llm.generate("Answer:", constrained(grammar, n=12, seed=4), use_tqdm=False)[0].outputs]
    assert all(re.fullmatch(r"yes|no|maybe [0-9]", a) for a in answers)


@pytest.mark.slow
def test_greedy_unconstrained_requests_in_the_same_batch_are_unchanged(llm):
    prompts = ["The capital of France is", "List three fruits:", "Once upon a time"]
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    alone = llm.generate(prompts, greedy, use_tqdm=False)
    mixed = llm.generate(
        [PROMPT] + prompts + [PROMPT],
        [constrained(StructuredOutputsParams(json=SCHEMA), seed=5)]
        + [greedy] * 3
        + [constrained(StructuredOutputsParams(regex=r"\d+"), temperature=0.0)],
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in mixed[1:4]] == [o.outputs[0].token_ids for o in alone]
    jsonschema.validate(json.loads(mixed[0].outputs[0].text), SCHEMA)
    assert re.fullmatch(r"\d+", mixed[4].outputs[0].text)


@pytest.mark.slow
def test_a_grammar_that_cannot_finish_in_max_tokens_ends_with_length(llm):
    [completion] = llm.generate(
        PROMPT, constrained(StructuredOutputsParams(json=SCHEMA), max_tokens=6), use_tqdm=False
    )[0].outputs
    assert completion.finish_reason == "length" and len(completion.token_ids) == 6
    with pytest.raises(json.JSONDecodeError):
        json.loads(completion.text)


@pytest.mark.parametrize(
    "spec, message",
    [
        (StructuredOutputsParams(json={"type": "objekt"}), "json is invalid.*objekt"),
        (StructuredOutputsParams(regex="a(b"), "regex is invalid.*parenthesis"),
        (StructuredOutputsParams(grammar="root ::= missing_rule"), "grammar is invalid"),
    ],
)
@pytest.mark.slow
def test_bad_specs_are_refused_with_what_is_wrong(llm, spec, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(PROMPT, constrained(spec), use_tqdm=False)
    assert not llm.has_unfinished_requests()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of"),
        ({"json": {"type": "object"}, "regex": "a"}, "exactly one of"),
        ({"json": "{not json"}, "not valid JSON"),
        ({"choice": []}, "choice"),
    ],
)
def test_specs_take_exactly_one_valid_constraint(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)


def test_grammar_of_names_a_missing_library(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ValueError, match="pip install 'nanovllm\\[structured\\]'"):
        grammar_of(StructuredOutputsParams(regex="a+"))


@pytest.mark.slow
def test_a_constrained_step_launches_its_forward_before_the_step_in_flight_is_read_back(llm):
    # the grammar needs step n's token for step n + 1's mask: only the sampling waits for it
    events = record_order(llm)
    llm.generate("Digits:", constrained(StructuredOutputsParams(regex=r"\d{6}"), temperature=0.0), use_tqdm=False)
    launches = [n for kind, n in events if kind == "launch"]
    assert len(launches) >= 6
    for n in launches[:-1]:
        assert events.index(("launch", n + 1)) < events.index(("read", n)) < events.index(("sample", n + 1))
