"""Conversations rendered with a chat template, for LLM.chat and the chat endpoint."""

import os

import jinja2
from transformers import PreTrainedTokenizerBase

from nanovllm.frontend.input_processor import check_unicode


def _joined_text(content: list, where: str) -> str:
    """The text parts of an OpenAI content-part list, one per line (as vLLM joins them)."""
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            shown = repr(kind) if kind is not None else f"a {type(part).__name__} without a 'type'"
            raise ValueError(
                f"{where}, part {i} is {shown}: this is a text-only model, so a message's content "
                f"must be a string or a list of {{'type': 'text', 'text': ...}} parts"
            )
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}, part {i}: a text part needs 'text' as a string, got {part.get('text')!r}")
        texts.append(part["text"])
    return "\n".join(texts)


def text_messages(messages: list[dict]) -> list[dict]:
    """The messages with each content-part list joined into one string; ValueError for a part that is not
    text (an image, audio ...) or a message that is not a dict."""
    flat = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {type(message).__name__}")
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": _joined_text(content, f"message {i}")}
        flat.append(message)
    return flat


def _check_tools(tools) -> None:
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError(
            f"tools must be a list of OpenAI tool dicts ({{'type': 'function', 'function': {{...}}}}), got {tools!r}"
        )


def render_chat(
    tokenizer: PreTrainedTokenizerBase | None,
    messages: list[dict],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template: str | None = None,
    chat_template_kwargs: dict | None = None,
    tools: list[dict] | None = None,
) -> str:
    """The conversation as text in `chat_template` (default: the tokenizer's), ready for the reply:
    with the template's generation prompt, or continuing the last (assistant) message; `tools` (OpenAI
    tool dicts) are the functions the template describes to the model. A message's content is a string
    or a list of OpenAI text parts, which are joined one per line."""
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer, but skip_tokenizer_init=True; render the prompt yourself")
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            "this model's tokenizer has no chat template; give one (the server's --chat-template "
            "FILE_OR_STRING, a request's chat_template field, or LLM.chat's chat_template) or use "
            "plain prompts"
        )
    if not messages:
        raise ValueError("the conversation is empty; send at least one message")
    messages = text_messages(messages)
    _check_tools(tools)
    if add_generation_prompt and continue_final_message:
        raise ValueError(
            "add_generation_prompt and continue_final_message cannot both be true: the reply "
            "either starts a new assistant turn or continues the last message"
        )
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **(chat_template_kwargs or {}),
        )
    except (jinja2.TemplateError, ValueError, TypeError) as e:
        raise ValueError(f"the chat template refused these messages: {e}") from None
    check_unicode(text, "the rendered conversation")
    return text


def load_chat_template(value: str) -> str:
    """A chat template given as a file's path (the file is read) or as the template itself (text with
    Jinja's braces); ValueError for a name that is neither."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:
        raise ValueError(
            f"chat template {value!r} is neither a file nor a Jinja template; give the path of a "
            f"template file or the template text itself"
        )
    return value
