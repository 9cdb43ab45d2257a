"""The 0731/0813 chat encoding against the published goldens (vLLM's reference fixtures for its 0731
encoder, tests/dsv4/encoding_0731/PROVENANCE.json): text byte for byte and ids in the tiny tokenizer;
the reasoning-effort table of each release; a prompt for the wrong release is an error naming both."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4.config import preset, with_dspark
from dsv4.encoding import REASONING_EFFORT_MAX, EncodingError, encode_messages
from dsv4.encoding_release import (REASONING_EFFORT_BEYOND, check_prompt_release, encode_for_release,
                                   release_of)
from dsv4.tokenizer import tiny_tokenizer

D = Path(__file__).parent / "encoding_0731"
CASES = {1: ("thinking", "low"), 3: ("thinking", "low"), 4: ("chat", None)}


def _messages(n: int) -> list[dict]:
    data = json.loads((D / f"test_input_{n}.json").read_text(encoding="utf-8"))
    if isinstance(data, list):
        return data
    msgs = [dict(m) for m in data["messages"]]
    sys = next(m for m in msgs if m["role"] == "system")   # request tools ride the system message
    sys["tools"] = data["tools"]
    return msgs


@pytest.mark.parametrize("n", sorted(CASES))
def test_published_0731_goldens_text_and_ids(n) -> None:
    mode, effort = CASES[n]
    text = encode_for_release(_messages(n), mode, "0731", reasoning_effort=effort)
    assert text == (D / f"test_output_{n}.txt").read_text(encoding="utf-8")
    ids = tiny_tokenizer(512).encode(text)
    assert ids == json.loads((D / f"test_output_{n}.tiny_ids.json").read_text())


def test_0731_effort_table_moves_every_april_level_down_one() -> None:
    hello = [{"role": "user", "content": "Hello"}]
    tail = "<｜User｜>Hello<｜Assistant｜><think>"
    bos = "<｜begin▁of▁sentence｜>"
    assert encode_for_release(hello, "thinking", "0731") == bos + tail                        # default low
    assert encode_for_release(hello, "thinking", "0731", "high") == bos + REASONING_EFFORT_MAX + tail
    assert encode_for_release(hello, "thinking", "0731", "max") == bos + REASONING_EFFORT_BEYOND + tail
    assert encode_for_release(hello, "thinking", "april", "max") == bos + REASONING_EFFORT_MAX + tail
    assert encode_for_release(hello, "thinking", "april", "high") == bos + tail
    assert encode_for_release(hello, "chat", "0731", "max") == bos + "<｜User｜>Hello<｜Assistant｜></think>"
    # April prompts are the April encoder's, unchanged
    assert encode_for_release(hello, "thinking", "april", "max") == encode_messages(hello, "thinking",
                                                                                   reasoning_effort="max")


def test_a_level_of_the_other_release_is_an_error_naming_both() -> None:
    with pytest.raises(EncodingError, match=r"april encoding accepts .* found 'low' \(a 0731 level\).*april release"):
        encode_for_release([{"role": "user", "content": "x"}], "thinking", "april", "low")
    with pytest.raises(EncodingError, match=r"release: expected one of \['april', '0731'\]"):
        encode_for_release([{"role": "user", "content": "x"}], "thinking", "0813")


def test_a_0731_prompt_for_an_april_checkpoint_is_refused() -> None:
    text = encode_for_release([{"role": "user", "content": "x"}], "thinking", "0731", "max")
    check_prompt_release(text, "0731")
    with pytest.raises(EncodingError, match=r"encoded for the 0731 release .* checkpoint is the april release"):
        check_prompt_release(text, release_of(preset("flash")))
    assert release_of(with_dspark(preset("flash"))) == "0731" and release_of(preset("pro-0813")) == "0731"


def test_reasoning_alias_must_agree() -> None:
    m = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r",
                                            "reasoning_content": "s"}, {"role": "user", "content": "q2"}]
    with pytest.raises(EncodingError, match="reasoning and reasoning_content differ"):
        encode_for_release(m, "thinking", "0731")


def test_the_harness_encodes_in_the_checkpoint_release() -> None:
    from parity.inputs import PromptError, encode_prompts, select_prompts

    prompts = select_prompts("thinking", None, None)[:1]
    tok = tiny_tokenizer(512)
    april = encode_prompts(prompts, tok, 512, reasoning_effort="max", release="april")[0]
    new = encode_prompts(prompts, tok, 512, reasoning_effort="max", release="0731")[0]
    assert REASONING_EFFORT_MAX in april.text and REASONING_EFFORT_BEYOND in new.text
    with pytest.raises(PromptError, match=r"found 'low' \(a 0731 level\).*april release"):
        encode_prompts(prompts, tok, 512, reasoning_effort="low", release="april")
