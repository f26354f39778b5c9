"""Demo: a few chat prompts answered in one batch by the bundled SmolLM2-135M-Instruct."""

import argparse

from nanovllm import LLM, SamplingParams
from nanovllm.default_model import default_model_dir

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for staying focused while studying.",
    "Write a haiku about the sea.",
    "Explain in one sentence what a CPU does.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled SmolLM2)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()

    llm = LLM(args.model or default_model_dir())
    prompts = [
        llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]
    outputs = llm.generate(prompts, SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens))
    for question, output in zip(QUESTIONS, outputs):
        print(f"\n>>> {question}\n{output['text'].strip()}")


if __name__ == "__main__":
    main()
