"""The tokenizer must fit the config before any compute (size, BOS/EOS); synthetic checkpoints of
any width carry a tokenizer that decodes every id their model can emit."""
from __future__ import annotations

import shutil

import pytest

from dsv4.config import preset
from dsv4.tokenizer import (DSV4Tokenizer, TokenizerError, build_tiny_tokenizer, check_tokenizer_matches,
                            tiny_tokenizer, write_tokenizer)


def test_wrong_width_and_wrong_specials_are_refused():
    with pytest.raises(TokenizerError, match="129280 ids, found one of 512 tokens"):
        check_tokenizer_matches(preset("flash"), tiny_tokenizer())
    with pytest.raises(TokenizerError, match="at most vocab_size=512 tokens .* found 1024"):
        check_tokenizer_matches(preset("tiny"), DSV4Tokenizer(build_tiny_tokenizer(1024, fill=True)))
    with pytest.raises(TokenizerError, match="BOS/EOS ids 3/1"):
        check_tokenizer_matches(preset("tiny").replace(bos_token_id=3), tiny_tokenizer())
    check_tokenizer_matches(preset("tiny"), tiny_tokenizer())


def test_filled_tokenizer_decodes_every_id_of_a_wide_model():
    tok = DSV4Tokenizer(build_tiny_tokenizer(129280, fill=True))
    check_tokenizer_matches(preset("flash"), tok)
    assert tok.decode([33237]) == "<|synth_33237|>"
    assert tok.encode("hello") == tiny_tokenizer().encode("hello")   # the fill is unreachable by merges


def test_first_token_refuses_a_mismatched_tokenizer_before_compute(tmp_path, capsys):
    from dsv4.checkpoint.synth import resolve_preset
    from parity.first_token import main

    ck = tmp_path / "ck"
    shutil.copytree(resolve_preset("tiny"), ck)
    write_tokenizer(build_tiny_tokenizer(1024, fill=True), ck)
    assert main(["--checkpoint", str(ck), "--mode", "chat", "--device", "cpu"]) == 2
    out = capsys.readouterr()
    assert "vocab_size=512" in (out.out + out.err).replace("\n", " ")
