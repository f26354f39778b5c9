"""Demo: a few chat prompts answered in one batch by the bundled SmolLM2-135M-Instruct."""

import argparse

from nanovllm import LLM, SamplingParams
from nanovllm.default_model import CHAT_QUESTIONS, chat_prompt, default_model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled SmolLM2)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()

    llm = LLM(args.model or default_model_dir())
    prompts = [chat_prompt(llm.tokenizer, q) for q in CHAT_QUESTIONS]
    outputs = llm.generate(prompts, SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens))
    for question, output in zip(CHAT_QUESTIONS, outputs):
        print(f"\n>>> {question}\n{output.outputs[0].text.strip()}")


if __name__ == "__main__":
    main()
