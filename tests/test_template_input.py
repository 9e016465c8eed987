"""Native tool calls reach a chat template with their arguments as a mapping (as vLLM's and
transformers' servers pass them), and a server with them as the JSON string of OpenAI's format."""
from __future__ import annotations

import json

import pytest

from harness.render import PromptRenderer, chat_input
from tests.conftest import SHARED, make_cfg
from tests.test_propensity import JinjaTokenizer, at_limit

# the tool-call line of Qwen2.5's template (Llama 3's and Mistral's `tojson` their arguments too)
TOJSON = (
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}"
    "<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}</tool_call>"
    "{%- endfor %}{%- endfor %}"
    "{%- if tools %}{%- endif %}{%- if add_generation_prompt %}<|assistant|>{%- endif %}")


def render(template_path, cfg, episode) -> str:
    return PromptRenderer(JinjaTokenizer(template_path), cfg.model)(episode.messages, episode.tools)


@pytest.mark.parametrize("template", ["inline", "qwen2.5"])
def test_a_template_sees_each_call_once_encoded(tmp_path, template):
    if template == "inline":
        path = tmp_path / "t.jinja"
        path.write_text(TOJSON, encoding="utf-8")
    else:
        path = SHARED / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
        if not path.is_file():
            pytest.skip(f"{path} is absent (../shared exists only in the project's workspace)")
    cfg = make_cfg("model=qwen2.5-coder-0.5b", "model.tool_format=native")
    episode = at_limit(cfg)
    before = json.dumps(episode.messages)
    prompt = render(path, cfg, episode)
    assert prompt.count('"arguments": {"company": "Xfinity"') == episode.facts["calls_by_target"]["Xfinity"]
    assert '"arguments": "{' not in prompt  # a JSON string inside the JSON: what a string under `tojson` gives
    assert json.dumps(episode.messages) == before  # the episode's messages are not rewritten


def test_a_server_gets_the_arguments_as_a_json_string():
    cfg = make_cfg("model=qwen2.5-coder-0.5b")
    episode = at_limit(cfg)
    shown, _ = chat_input(episode.messages, episode.tools, native=True)
    calls = [c for m in shown for c in m.get("tool_calls") or []]
    assert calls and all(isinstance(c["function"]["arguments"], str) for c in calls)
