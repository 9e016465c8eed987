"""Attention probe without real weights: regions over a Qwen3-style template, the probe against the
naive output_attentions pass on a tiny random-weight Qwen3 (16 query / 8 KV heads, q/k norm,
<think>), the archive, and config errors. Needs only SmolLM2's tokenizer (from the model cache)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness.backends import Backend
from harness.context import ConditionConfig, view
from harness.context.bar import Placement, StatusBarConfig
from harness.errors import ConfigError
from harness.run import first_steps
from harness.measure.attention import store
from harness.measure.attention.probe import (
    ANSWER,
    THINKING,
    AttentionProbe,
    completion_phases,
    reference_masses,
)
from harness.measure.attention.regions import (
    GENERATED,
    TEMPLATE,
    episode_region_names,
    message_parts,
    prompt_regions,
)
from harness.render import PromptRenderer
from harness.types import Completion
from tests.conftest import make_cfg

torch = pytest.importorskip("torch")

# Qwen3's template in miniature: native tools, tool results as user <tool_response> turns, and an
# empty <think></think> on a final assistant turn after the last query (the case that makes a
# prefix of the conversation render differently from the full prompt)
QWEN3_LIKE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>{% for t in tools %}
{{ t | tojson }}{% endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- set ns = namespace(last_query=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_query = loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'assistant' %}<|im_start|>assistant
{% if loop.index0 > ns.last_query and loop.last %}<think>

</think>

{% endif %}{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

GRID = ["scenario.calls_made=[3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
        "scenario.other_companies=[1]"]


class TinyQwen3(Backend):
    """The surface of the hf backend the probe uses, over a random-weight Qwen3 and SmolLM2's
    tokenizer with <think> and </think> added as tokens."""

    name = "hf"

    def hf_weights(self):
        return self

    def __init__(self):
        from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

        from harness.models import sources

        self.tokenizer = AutoTokenizer.from_pretrained(sources.resolve(make_cfg().model)[0])
        self.tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
        self.tokenizer.chat_template = QWEN3_LIKE
        torch.manual_seed(0)
        config = Qwen3Config(vocab_size=len(self.tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                             num_attention_heads=16, num_key_value_heads=8, head_dim=16, max_position_embeddings=4096)
        self.model = Qwen3ForCausalLM(config).eval()
        self.renderer = PromptRenderer(self.tokenizer, make_cfg().model)

    def render(self, request) -> str:
        return self.renderer(request.messages, request.tools)

    def describe(self) -> dict:
        return {"path": "random-qwen3", "revision": None, "dtype": "float32", "device": "cpu"}


@pytest.fixture(scope="module")
def tiny() -> TinyQwen3:
    return TinyQwen3()


@pytest.fixture(scope="module")
def samples():
    return {s.condition: s for s in first_steps(make_cfg(*GRID))}


def _names(episode):
    return episode_region_names(episode.messages, episode.tags)


def _regions(backend, sample):
    req = sample.request
    parts = message_parts(req.messages, req.messages, req.annotations, _names(sample.episode))
    return prompt_regions(lambda msgs: backend.render(replace(req, messages=msgs)), req.messages, parts)


@pytest.mark.parametrize("condition", ["none", "status_tail"])
def test_every_token_in_exactly_one_region(tiny, samples, condition):
    sample = samples[condition]
    regions = _regions(tiny, sample)
    assert regions.text == tiny.render(sample.request)
    enc = tiny.tokenizer(regions.text, add_special_tokens=False, return_offsets_mapping=True)
    token_regions = regions.token_regions(enc["offset_mapping"])
    assert len(token_regions) == len(enc["input_ids"]) and set(token_regions) <= set(range(len(regions.names)))

    def text_of(name: str) -> str:
        rid = regions.names.index(name)
        return "".join(regions.text[s:e] for (s, e), r in zip(enc["offset_mapping"], token_regions) if r == rid)

    episode = sample.episode
    assert [n for n in regions.names if n.startswith("call_record_")] == ["call_record_1", "call_record_2", "call_record_3"]
    assert {"system", "request", "other_call", "assistant", "question", TEMPLATE} <= set(regions.names)
    # the final assistant turn is not the last message: no <think> inserted, its content exactly
    assert text_of("assistant") == episode.messages[episode.tags.index("assistant")]["content"]
    assert text_of("question") == episode.messages[-1]["content"]
    assert "Xfinity" in text_of("call_record_2") and '"phone_call"' in text_of("call_record_2")
    assert text_of(TEMPLATE).endswith("<|im_start|>assistant\n")
    if condition == "status_tail":
        assert text_of("status").startswith("<agent_status>") and text_of("status").endswith("</agent_status>")
    else:
        assert "status" not in regions.names


def test_status_merged_into_a_message_is_split_out(tiny, samples):
    """A bar a condition merged into the system prompt (placement=head) is its own region; the
    system prompt around it keeps its region."""
    sample = samples["status_tail"]
    bar = sample.request.messages[-1]["content"]
    shown = view(sample.episode, ConditionConfig(status=StatusBarConfig(placement=Placement.head)))
    assert shown.messages[0]["content"] == sample.episode.messages[0]["content"] + "\n\n" + bar  # merged
    merged = replace(sample, request=replace(sample.request, messages=shown.messages, annotations=shown.annotations()))
    regions = _regions(tiny, merged)
    status = [i for i, r in enumerate(regions.char_region) if regions.names[r] == "status"]
    assert regions.text[status[0]:status[-1] + 1] == bar
    assert regions.names[regions.char_region[regions.text.index("customer-service")]] == "system"


def test_probe_equals_naive_attention_on_tiny_qwen3(tiny, samples):
    sample = samples["status_tail"]
    regions = _regions(tiny, sample)
    prompt = tiny.tokenizer(regions.text, add_special_tokens=False, return_offsets_mapping=True)
    text = "<think>\nThree calls already, the limit is 3.\n</think>\n\nI can't call Xfinity again."
    gen = tiny.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    phases = completion_phases(text, gen["offset_mapping"])
    think_end = gen["input_ids"].index(tiny.tokenizer.convert_tokens_to_ids("</think>"))
    assert phases == [THINKING] * (think_end + 1) + [ANSWER] * (len(phases) - think_end - 1)
    names = regions.names + [GENERATED]
    token_regions = regions.token_regions(prompt["offset_mapping"])
    args = (prompt["input_ids"], gen["input_ids"], token_regions, phases, len(names))

    result = AttentionProbe(tiny.model, chunk_size=4, strip_layer=1).run(*args, keep_rows=True)
    naive = reference_masses(tiny.model, *args)
    assert result.masses.shape == (2, 3, 16, len(names))
    np.testing.assert_allclose(result.masses, naive, atol=1e-4, rtol=0)
    for layer, rows in result.rows.items():  # every generated token's masses sum to 1, per head
        assert rows.shape == (16, len(phases), len(names))
        np.testing.assert_allclose(rows.sum(-1), 1.0, atol=1e-5)
    assert result.counts.tolist() == [think_end + 1, len(phases) - think_end - 1]
    np.testing.assert_allclose(result.masses.sum(-1), result.counts[:, None, None] * np.ones((2, 3, 16)), atol=1e-4)
    # the strip is layer 1's prompt share; with the generated keys it sums to 1 per row
    prompt_share = naive[:, 1, :, :-1].sum() / (16 * len(phases))
    assert result.strip.shape == (len(prompt["input_ids"]),)
    assert result.strip.sum() == pytest.approx(prompt_share, abs=1e-5)
    assert tiny.model.config._attn_implementation == "sdpa"  # the probe restores the model's kernel


def test_run_probe_measures_a_replayed_completion(tiny, samples, tmp_path):
    from harness.flow.probe import RunProbe

    cfg = make_cfg(*GRID, "probe.attention=true", "probe.chunk_size=5")
    probe = RunProbe(cfg.model, cfg.probe, tiny, tmp_path)
    sample = samples["none"]
    # an API-style completion: reasoning split off by the server, put back inside <think> for replay
    arrays = probe.measure_one(sample, Completion(text="No.", reasoning="The limit is reached."))
    assert arrays["counts"][THINKING] > 0 and arrays["counts"][ANSWER] > 0
    assert list(arrays["regions"])[-1] == GENERATED and arrays["masses"].shape[:3] == (2, 3, 16)
    assert '"generated_by": "hf"' in str(arrays["meta"]) and "random-qwen3" in str(arrays["meta"])
    # the sample browser shades the probe's own text per token: offsets cover it, one per token, in order
    text, offsets = str(arrays["prompt_text"]), arrays["token_offsets"]
    assert offsets.shape == (len(arrays["token_regions"]), 2) == (len(arrays["strip"]), 2)
    assert "".join(text[s:e] for s, e in offsets) == text and (np.diff(offsets[:, 0]) > 0).all()


def test_archive_appends_and_replaces(tmp_path):
    """Each batch is its own part; a later part's sample replaces an earlier one's; refs name the part."""
    first = store.append(tmp_path, {"a": {"x": np.arange(3)}, "b": {"x": np.ones(2)}})
    before = (tmp_path / "attention" / "part-000000.npz").read_bytes()
    second = store.append(tmp_path, {"b": {"x": np.zeros(4)}, "c": {"x": np.array(["r1", "r2"])}})
    assert first == {"a": "attention/part-000000.npz#a", "b": "attention/part-000000.npz#b"}
    assert second["c"] == "attention/part-000001.npz#c" and store.append(tmp_path, {}) == {}
    assert (tmp_path / "attention" / "part-000000.npz").read_bytes() == before  # never rewritten
    loaded = store.load(tmp_path)
    assert sorted(loaded) == ["a", "b", "c"]
    assert loaded["a"]["x"].tolist() == [0, 1, 2] and loaded["b"]["x"].tolist() == [0, 0, 0, 0]
    assert loaded["c"]["x"].tolist() == ["r1", "r2"]
    assert store.load_ref(tmp_path, first["b"])["x"].tolist() == [1, 1]  # the record's own part
    assert store.load_ref(tmp_path, second["b"])["x"].tolist() == [0, 0, 0, 0]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["part-000000.npz", "part-000001.npz"]


def test_archive_resume_adds_parts_and_ignores_partial_writes(tmp_path):
    """A killed write leaves only its temporary file, which readers skip and the next part does not
    collide with; a shard's parts are read with the run's, refs relative to the run directory."""
    (tmp_path / "records.jsonl").write_text("")
    store.append(tmp_path, {"b": {"x": np.arange(1)}, "a": {"x": np.arange(2)}})
    (tmp_path / "attention" / ".part-000001.npz.tmp-999").write_bytes(b"PK\x03\x04 truncated")
    refs = store.append(tmp_path, {"a": {"x": np.arange(5)}})
    assert refs == {"a": "attention/part-000001.npz#a"}
    shard = tmp_path / "shards" / "0-of-2"
    shard.mkdir(parents=True)
    (shard / "records.jsonl").write_text("")
    shard_refs = store.append(shard, {"c": {"x": np.arange(3)}})
    assert shard_refs == {"c": "shards/0-of-2/attention/part-000000.npz#c"}
    assert [p.relative_to(tmp_path).as_posix() for p in store.parts(tmp_path)] == [
        "attention/part-000000.npz", "attention/part-000001.npz", "shards/0-of-2/attention/part-000000.npz"]
    loaded = store.load(tmp_path)
    assert sorted(loaded) == ["a", "b", "c"] and loaded["a"]["x"].tolist() == [0, 1, 2, 3, 4]
    assert store.load_ref(tmp_path, shard_refs["c"])["x"].tolist() == [0, 1, 2]
    assert store.load(tmp_path / "nothing") == {}


@pytest.mark.parametrize("override, key", [("probe.chunk_size=0", "probe.chunk_size"), ("probe.device=tpu", "probe.device"),
                                           ("probe.dtype=int8", "probe.dtype")])
def test_bad_probe_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        make_cfg(override)


def test_strip_layer_out_of_range_names_the_key(tiny, tmp_path):
    from harness.flow.probe import RunProbe

    with pytest.raises(ConfigError, match="probe.strip_layer"):
        RunProbe(make_cfg().model, make_cfg("probe.attention=true", "probe.strip_layer=7").probe, tiny, tmp_path)


def test_report_section_states_status_and_call_record_shares(tmp_path):
    """Synthetic masses with known shares: the section's table and sentence report them."""
    import pandas as pd

    from analysis.attention_figures import sections

    regions = np.array(["template", "system", "call_record_1", "call_record_2", "question", "status", GENERATED])
    rows = []
    for sid, condition, share in (("a", "none", [0.5, 0.1, 0.1, 0.1, 0.2, 0.0, 0.0]),
                                  ("b", "status_tail", [0.4, 0.1, 0.05, 0.05, 0.1, 0.3, 0.0])):
        counts = np.array([0, 4])
        masses = np.zeros((2, 3, 2, len(regions)), dtype=np.float32)
        masses[1] = np.array(share) * counts[1]
        store.append(tmp_path, {sid: {"masses": masses, "counts": counts, "regions": regions,
                                      "token_regions": np.array([0, 1, 2, 3, 4, 5], dtype=np.int16),
                                      "strip": np.full(6, 0.1, dtype=np.float32), "strip_layer": np.array(2),
                                      "meta": np.array('{"generated_by": "hf", "replayed_with": {"path": "m"}}')}})
        rows.append({"sample_id": sid, "condition": condition, "episode_id": "e1", "run": str(tmp_path)})
    parts = sections(pd.DataFrame(rows), [tmp_path], tmp_path)
    table = parts[0].table.set_index(["condition", "region"])
    # one token per prompt region, 4 generated tokens; one episode: no interval
    assert table.at[("none", "call_records"), "share [95% CI]"] == "0.200 [–, –]"
    assert table.at[("none", "call_records"), "share per token [95% CI]"] == "0.1 [–, –]"  # 2 call-record tokens
    assert table.at[("status_tail", "status"), "share [95% CI]"] == "0.300 [–, –]"
    assert table.at[("status_tail", "status"), "episodes"] == 1
    assert "In `status_tail` the status bar gets 0.300" in parts[0].text and "in `none` the call records get 0.200" in parts[0].text
    for s in parts:
        assert s.figure is None or (tmp_path / f"{s.figure}.png").exists()
    assert sections(pd.DataFrame(rows), [tmp_path / "elsewhere"], tmp_path) == []


def test_attention_table_averages_episodes_with_a_t_interval():
    import pandas as pd
    from scipy import stats as sps

    from analysis.attention_figures import episode_table

    # 3 episodes x 2 replicates x 2 layers; the bar's share per episode 0.2, 0.3, 0.4 over 4 tokens
    rows = [{"condition": "status_tail", "episode_id": f"e{e}", "sample_id": f"e{e}r{r}", "layer": layer, "region": "status",
             "share": share, "per_token": share / 4, "phase": "all"}
            for e, share in enumerate((0.2, 0.3, 0.4)) for r in range(2) for layer in range(2)]
    t = episode_table(pd.DataFrame(rows)).iloc[0]
    ref = sps.ttest_1samp([0.2, 0.3, 0.4], 0).confidence_interval()
    assert (t["share"], t["share_low"], t["share_high"]) == pytest.approx((0.3, ref.low, ref.high))
    assert (t["per_token"], t["per_token_low"], t["per_token_episodes"]) == pytest.approx((0.075, ref.low / 4, 3))


def test_regions_on_hermes_converted_prompt(samples):
    """SmolLM2's own template knows no tools: calls and results reach it Hermes-style in content,
    as the hf backend renders them; each call record still covers its call and its result."""
    from transformers import AutoTokenizer

    from harness.models import sources
    from harness.render import to_hermes

    tok = AutoTokenizer.from_pretrained(sources.resolve(make_cfg().model)[0])
    req = samples["status_tail"].request

    def render(msgs):
        return tok.apply_chat_template(to_hermes(msgs, req.tools), tokenize=False, add_generation_prompt=True)

    shown = to_hermes(req.messages, req.tools)
    parts = message_parts(req.messages, shown, req.annotations, _names(samples["status_tail"].episode))
    regions = prompt_regions(render, req.messages, parts)
    enc = tok(regions.text, add_special_tokens=False, return_offsets_mapping=True)
    token_regions = regions.token_regions(enc["offset_mapping"])
    assert len(token_regions) == len(enc["input_ids"])
    record = "".join(regions.text[s:e] for (s, e), r in zip(enc["offset_mapping"], token_regions)
                     if regions.names[r] == "call_record_1")
    assert record.startswith("<tool_call>") and record.endswith("</tool_response>") and "Xfinity" in record
    assert "# Tools" in "".join(regions.text[s:e] for (s, e), r in zip(enc["offset_mapping"], token_regions)
                                if regions.names[r] == "system")


def test_text_a_condition_adds_inside_a_message_is_added(tiny):
    """turn_meta opens the user's question with a <turn_meta> block; a note appended to a tool result
    (as the loop guard's warnings are): what either mechanism marked is its region, the separators
    they wrote are `added`, the original content keeps its region, with the model's own template and
    with Hermes-converted tool turns."""
    from transformers import AutoTokenizer

    from harness.models import sources
    from harness.render import to_hermes

    sample = first_steps(make_cfg(*GRID, "condition=[turn_meta]", "conditions.turn_meta.turn_meta.last_only=true"))[0]
    episode = sample.episode
    assert sample.condition_cfg.turn_meta.last_only
    shown = view(episode, sample.condition_cfg)  # the plan's view, to add a marked note to
    assert shown.messages == sample.request.messages and shown.annotations() == sample.request.annotations
    question = episode.messages[-1]["content"]
    block = shown.messages[-1]["content"][:shown.messages[-1]["content"].index(question)].removesuffix("\n\n")
    assert block.startswith("<turn_meta>") and shown.messages[-1]["content"] == block + "\n\n" + question
    tool = next(i for i, m in enumerate(shown.messages) if m["role"] == "tool")
    note = "[loop guard] 3 consecutive failures with the same arguments: try another approach."
    shown.extend(tool, note, "loop_guard")  # as the loop guard's step marks its note
    messages, annotations = shown.messages, shown.annotations()
    hermes_tok = AutoTokenizer.from_pretrained(sources.resolve(make_cfg().model)[0])

    def hermes(msgs):
        return hermes_tok.apply_chat_template(to_hermes(msgs, sample.request.tools), tokenize=False,
                                              add_generation_prompt=True)

    for render, as_shown in ((lambda msgs: tiny.render(replace(sample.request, messages=msgs)), messages),
                             (hermes, to_hermes(messages, sample.request.tools))):
        parts = message_parts(messages, as_shown, annotations, _names(episode))
        regions = prompt_regions(render, messages, parts)

        def chars(name: str, regions=regions) -> str:
            return "".join(c for c, r in zip(regions.text, regions.char_region) if regions.names[r] == name)

        assert chars("loop_guard") == note and chars("turn_meta") == block
        assert chars("added") == "\n\n" + "\n\n"  # the note's separator, then the block's
        assert chars("question") == question
        record = chars("call_record_1")
        assert episode.messages[tool]["content"] in record and "[loop guard]" not in record
        if render is hermes:  # the conversion's wrapper stays with the call record, as for unchanged turns
            assert record.endswith("</tool_response>")
        assert block not in chars(TEMPLATE) and "loop guard" not in chars(TEMPLATE)
