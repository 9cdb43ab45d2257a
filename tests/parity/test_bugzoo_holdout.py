"""The bug zoo's hold-out prompt set: valid, both modes, within the tiny token budget, and disjoint
from the standard set the thresholds were calibrated on (else the zoo would test on training data)."""
from __future__ import annotations

from dsv4.prompts import load_prompt_set
from dsv4.tokenizer import tiny_tokenizer
from parity.bugzoo.runner import holdout_prompt_path

MIN_TOKENS, MAX_TOKENS = 48, 160   # as the standard set: the tiny compressed layers need >= 32 tokens


def test_holdout_set_is_valid_and_mixed() -> None:
    prompts = load_prompt_set(holdout_prompt_path())
    assert len(prompts) >= 6
    assert {p.mode for p in prompts} == {"chat", "thinking"}
    assert any(len(p.messages) > 2 for p in prompts) and any(p.messages[0]["role"] == "system" for p in prompts)
    assert any(not p.render().isascii() for p in prompts)


def test_holdout_prompts_fit_the_tiny_token_budget() -> None:
    tok = tiny_tokenizer()
    counts = {p.id: len(tok.encode(p.render(), max_id=511)) for p in load_prompt_set(holdout_prompt_path())}
    outside = {pid: n for pid, n in counts.items() if not MIN_TOKENS <= n <= MAX_TOKENS}
    assert not outside, f"token counts outside [{MIN_TOKENS}, {MAX_TOKENS}]: {outside}"


def test_holdout_shares_nothing_with_the_standard_set() -> None:
    std, ho = load_prompt_set(), load_prompt_set(holdout_prompt_path())
    assert not {p.id for p in std} & {p.id for p in ho}
    assert not {p.render() for p in std} & {p.render() for p in ho}
    std_msgs = {m.get("content") for p in std for m in p.messages}
    assert not std_msgs & {m.get("content") for p in ho for m in p.messages}
