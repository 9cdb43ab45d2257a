"""The standard parity prompt set: shape, rendering and the tiny-model token budget."""
from __future__ import annotations

from pathlib import Path

import pytest

from dsv4.prompts import Prompt, PromptSetError, default_prompt_path, load_prompt_set
from dsv4.tokenizer import tiny_tokenizer

MIN_TOKENS, MAX_TOKENS = 48, 160  # the tiny model's compressed layers need >= 32 tokens


@pytest.fixture(scope="module")
def prompts() -> list[Prompt]:
    return load_prompt_set()


def test_default_prompt_set_is_the_packaged_file(prompts: list[Prompt]) -> None:
    assert default_prompt_path().name == "prompts.toml" and default_prompt_path().is_file()
    assert load_prompt_set(default_prompt_path()) == prompts


def test_prompt_set_mix(prompts: list[Prompt]) -> None:
    assert len(prompts) >= 8
    assert len({p.id for p in prompts}) == len(prompts)
    assert {p.mode for p in prompts} == {"chat", "thinking"}
    assert any(len(p.messages) > 2 and p.messages[0]["role"] == "system" for p in prompts)
    assert any(not p.render().isascii() for p in prompts)


def test_every_prompt_renders_within_the_token_budget(prompts: list[Prompt]) -> None:
    tok = tiny_tokenizer()
    counts = {p.id: len(tok.encode(p.render(), max_id=511)) for p in prompts}
    outside = {pid: n for pid, n in counts.items() if not MIN_TOKENS <= n <= MAX_TOKENS}
    assert not outside, f"token counts outside [{MIN_TOKENS}, {MAX_TOKENS}]: {outside}"


def test_rendered_prompts_end_with_their_mode_marker(prompts: list[Prompt]) -> None:
    for p in prompts:
        text = p.render()
        assert text.startswith("<｜begin▁of▁sentence｜>")
        suffix = "<｜Assistant｜><think>" if p.mode == "thinking" else "<｜Assistant｜></think>"
        assert text.endswith(suffix), p.id


@pytest.mark.parametrize("body, fragment", [
    ('[[prompts]]\nid = "a"\nmode = "fast"\nmessages = [{role = "user", content = "x"}]\n', "expected mode in"),
    ('[[prompts]]\nid = "a"\nmode = "chat"\nmessages = [{role = "user", content = "x"}]\n' * 2,
     "unique non-empty string id"),
    ('[[prompts]]\nid = "a"\nmode = "chat"\nmessages = [{role = "bot", content = "x"}]\n', "role: expected"),
    ('[[prompts]]\nid = "a"\nmode = "chat"\nmessages = []\n', "non-empty messages"),
    ("prompts = 3\n", r"non-empty \[\[prompts\]\]"),
    ("[[prompts]\n", "invalid TOML"),
])
def test_malformed_prompt_sets_are_rejected(tmp_path: Path, body: str, fragment: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(PromptSetError, match=fragment):
        load_prompt_set(path)


def test_missing_prompt_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(PromptSetError, match="none.toml"):
        load_prompt_set(tmp_path / "none.toml")
