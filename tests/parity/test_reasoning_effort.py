"""--reasoning-effort: the encoder's effort setting reaches the prompts, only in thinking mode."""
from __future__ import annotations

import pytest

from dsv4.prompts import load_prompt_set
from dsv4.tokenizer import tiny_tokenizer
from parity.inputs import PromptError, encode_prompts


def test_effort_changes_thinking_prompts_and_renames_them():
    thinking = [p for p in load_prompt_set() if p.mode == "thinking"][:1]
    plain = encode_prompts(thinking, tiny_tokenizer(), 512)[0]
    maxed = encode_prompts(thinking, tiny_tokenizer(), 512, reasoning_effort="max")[0]
    high = encode_prompts(thinking, tiny_tokenizer(), 512, reasoning_effort="high")[0]
    assert maxed.id == f"{plain.id}@max" and "Reasoning Effort" in maxed.text and len(maxed.ids) > len(plain.ids)
    assert high.text == plain.text            # April: 'high' adds nothing (spec §13)


def test_effort_on_a_chat_prompt_is_bad_input():
    chat = [p for p in load_prompt_set() if p.mode == "chat"][:1]
    with pytest.raises(PromptError, match="applies to thinking prompts"):
        encode_prompts(chat, tiny_tokenizer(), 512, reasoning_effort="max")


def test_a_mistyped_prompt_id_is_not_run_as_text():
    from parity.inputs import select_prompts

    with pytest.raises(PromptError, match=r"'thinking-trian'.*closest: \['thinking-train'"):
        select_prompts("thinking", ["thinking-trian"])
    assert select_prompts("chat", ["what is two plus two"])[0].id.startswith("custom-")
