"""Chat templates: where one comes from, and the error when there is none."""

import pytest

from nanovllm.frontend.chat import load_chat_template, render_chat


def test_a_chat_template_is_a_file_or_the_template_itself(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert load_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    assert load_chat_template("{{ 'x' }}") == "{{ 'x' }}"
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_without_any_chat_template_the_error_names_the_flag_and_the_request_field(tiny_tokenizer):
    assert not tiny_tokenizer.chat_template
    with pytest.raises(ValueError, match="--chat-template FILE_OR_STRING, a request's chat_template field"):
        render_chat(tiny_tokenizer, [{"role": "user", "content": "w5"}])
    own = render_chat(tiny_tokenizer, [{"role": "user", "content": "w5"}], chat_template="{{ messages[0].content }}")
    assert own == "w5"
