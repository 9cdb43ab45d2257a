"""The acceptance judge (parity/dspark/acceptance.py, docs/dspark.md): bad input is one error (exit 2),
dumps made by our own native model are judged: a clean one passes, each injected draft fault is
flagged, an engine that never drafts is flagged by its counts alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity.bugzoo.draft_zoo import DSPARK_FAULTS
from parity.dspark.__main__ import main as dspark_main
from parity.dspark.acceptance import FORMAT, check_servable, judge_acceptance, read_dump
from parity.dspark.acceptance_dump import dump_native
from parity.errors import ParityInputError
from parity.inputs import encode_prompts, select_prompts
from parity.source import resolve_checkpoint

CKPT = "tiny-trained-dspark"


def _prompts(ids: list[str] | None = None) -> list:
    src = resolve_checkpoint(CKPT, 0)
    return encode_prompts(select_prompts("chat", ids, None), src.tokenizer, src.config.vocab_size)


def _write(path: Path, header: dict, lines: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(x) for x in [header, *lines]) + "\n", encoding="utf-8")
    return path


HEADER = {"format": FORMAT, "format_version": 1, "engine": "test", "num_speculative_tokens": 2,
          "temperature": 0.0, "draft_sample_method": "greedy", "precision": "nvfp4"}
LINE = {"prompt_id": "p", "prompt_ids": [0, 2, 75], "output_tokens": [5, 6, 7, 8], "accepted": [1, 0]}


@pytest.mark.parametrize("header, line, expected", [
    ({**HEADER, "format": "other"}, LINE, "expected format"),
    ({**HEADER, "temperature": 0.7}, LINE, "expected greedy speculation"),
    (HEADER, {**LINE, "accepted": [3, 0]}, "expected counts in [0, 2]"),
    (HEADER, {**LINE, "output_tokens": [5, 6]}, "expected 4 tokens"),
    (HEADER, {k: v for k, v in LINE.items() if k != "accepted"}, "expected a 'accepted' field"),
])
def test_bad_input_is_one_error(tmp_path: Path, header: dict, line: dict, expected: str) -> None:
    with pytest.raises(ParityInputError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        read_dump(_write(tmp_path / "c.jsonl", header, [line]))


def test_more_speculative_tokens_than_the_block_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    gamma = resolve_checkpoint(CKPT, 0).config.dspark_block_size
    line = {**LINE, "output_tokens": [5] * (1 + 2 * (gamma + 2)), "accepted": [gamma + 2, gamma + 1]}
    f = _write(tmp_path / "k.jsonl", {**HEADER, "num_speculative_tokens": gamma + 2}, [line])
    with pytest.raises(ParityInputError, match=f"at most dspark_block_size = {gamma}"):
        check_servable(read_dump(f), resolve_checkpoint(CKPT, 0).config)
    assert dspark_main(["acceptance", "--counts", str(f)]) == 2
    err = capsys.readouterr()
    assert f"found {gamma + 2}" in err.out + err.err


def test_fp32_clean_passes_and_a_fault_fails_exactly(tmp_path: Path) -> None:
    """One prompt, 16 tokens, FP32 both sides (~25 s): the clean dump agrees to FP32 rounding, the
    Markov fault is flagged by its logits and its counts."""
    p = _prompts(["chat-capital"])
    clean = read_dump(dump_native(CKPT, tmp_path / "clean.jsonl", prompts=p, k=5, n_tokens=16, precision="fp32"))
    v = judge_acceptance(clean, CKPT)
    assert v.mode == "exact" and v.passed and v.kl_worst < 1e-9 and v.count_mismatches == 0, v.failures
    bad = read_dump(dump_native(CKPT, tmp_path / "bad.jsonl", prompts=p, k=5, n_tokens=16, precision="fp32",
                                fault="dspark_markov_from_anchor"))
    v = judge_acceptance(bad, CKPT)
    assert not v.passed and v.kl_worst > 1e-3


def test_k_below_the_block_is_judged(tmp_path: Path) -> None:
    """k = 2 < dspark_block_size: servable; the reference proposes its first 2 tokens (~15 s)."""
    d = read_dump(dump_native(CKPT, tmp_path / "k2.jsonl", prompts=_prompts(["chat-capital"]), k=2, n_tokens=16,
                              precision="fp32", with_logits=False))
    assert d.k == 2 and max(n for pc in d.prompts for n in pc.accepted) <= 2
    v = judge_acceptance(d, CKPT)
    assert v.passed and v.kl_worst is None, v.failures


@pytest.mark.slow   # slow: 7 faults x (dump + judge) in FP32 and 4 NVFP4 judgements on 5 prompts (~6 min)
def test_every_draft_fault_flagged_and_clean_passes(tmp_path: Path) -> None:
    prompts = _prompts()
    for name in DSPARK_FAULTS:
        d = read_dump(dump_native(CKPT, tmp_path / f"{name}.jsonl", prompts=prompts, k=5, precision="fp32", fault=name))
        v = judge_acceptance(d, CKPT)
        assert not v.passed and v.count_mismatches > 0 and v.kl_worst > 1e-3, name
    clean = read_dump(dump_native(CKPT, tmp_path / "clean.jsonl", prompts=prompts, k=5))
    v = judge_acceptance(clean, CKPT)
    assert v.mode == "band" and v.passed and v.detectable > v.band, v.failures
    for name in ("field_dspark_padding_in_softmax", "field_dspark_shared_experts_dropped", "dspark_markov_from_anchor"):
        d = read_dump(dump_native(CKPT, tmp_path / f"{name}.nv.jsonl", prompts=prompts, k=5, fault=name))
        assert not judge_acceptance(d, CKPT).passed, name
    # an engine that never drafts (τ = 1): flagged by its counts alone, no logits
    for pc in clean.prompts:
        pc.accepted, pc.draft_logits = [0] * (len(pc.output_tokens) - 1), None
    v = judge_acceptance(clean, CKPT)
    assert not v.passed and v.gap < -v.band and v.kl_worst is None
