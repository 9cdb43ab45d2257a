"""The tiny byte-level tokenizer, the DSV4Tokenizer wrapper and tokenizer.json loading/writing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models

from dsv4.encoding import encode_messages
from dsv4.tokenizer import (SPECIAL_TOKENS, DSV4Tokenizer, TokenizerError, build_tiny_tokenizer,
                            load_tokenizer, tiny_tokenizer, write_tokenizer)


@pytest.fixture(scope="module")
def tok() -> DSV4Tokenizer:
    return tiny_tokenizer()


def test_special_tokens_cover_the_v4_set_with_full_width_bars() -> None:
    assert SPECIAL_TOKENS[:2] == ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
    for s in ("<｜User｜>", "<｜Assistant｜>", "<｜latest_reminder｜>", "<think>", "</think>",
              "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>",
              "<｜DSML｜parameter", "</｜DSML｜parameter>", "<tool_result>", "</tool_result>",
              "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>"):
        assert s in SPECIAL_TOKENS
    assert len(set(SPECIAL_TOKENS)) == len(SPECIAL_TOKENS)
    assert all("\uff5c" in s for s in SPECIAL_TOKENS if "｜" in s) and "|" not in "".join(SPECIAL_TOKENS)


def test_specials_are_single_ids_with_bos_0_and_eos_1(tok: DSV4Tokenizer) -> None:
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    ids = [tok.encode(s) for s in SPECIAL_TOKENS]
    assert ids == [[i] for i in range(len(SPECIAL_TOKENS))]
    assert tok.special_ids() == {s: i for i, s in enumerate(SPECIAL_TOKENS)}


def test_specials_inside_text_are_matched(tok: DSV4Tokenizer) -> None:
    prompt = encode_messages([{"role": "user", "content": "Hi"}], "chat")
    ids = tok.encode(prompt)
    user, assistant, think_end = (tok.token_to_id(s) for s in ("<｜User｜>", "<｜Assistant｜>", "</think>"))
    assert ids[:2] == [0, user] and ids[-2:] == [assistant, think_end]
    assert len(ids) == 4 + 2  # "Hi" is two bytes


def test_size_and_determinism() -> None:
    first, second = build_tiny_tokenizer(), build_tiny_tokenizer()
    assert first.to_str() == second.to_str()
    assert first.get_vocab_size() <= 512
    assert build_tiny_tokenizer(300).get_vocab_size() <= 300
    assert build_tiny_tokenizer(300).to_str() != first.to_str()


def test_too_small_vocab_is_rejected() -> None:
    with pytest.raises(TokenizerError, match=r"expected >= 277 .* found 100"):
        build_tiny_tokenizer(100)


def test_merges_compress_common_words(tok: DSV4Tokenizer) -> None:
    assert len(tok.encode(" the")) == 1
    text = "What is the answer to the question?"
    assert len(tok.encode(text)) < len(text.encode("utf-8")) // 2


_SHARED = tiny_tokenizer()  # hypothesis tests cannot take function-scoped fixtures


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(), st.sampled_from(SPECIAL_TOKENS)), max_size=6).map("".join))
def test_any_unicode_round_trips(text: str) -> None:
    assert _SHARED.decode(_SHARED.encode(text)) == text


def test_chinese_and_emoji_round_trip_bytewise(tok: DSV4Tokenizer) -> None:
    text = "机器学习 🤖 café\n\t"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) >= len("机器学习🤖".encode("utf-8")) - 4  # multi-byte chars stay byte tokens


def test_encode_rejects_ids_beyond_the_model_vocabulary(tok: DSV4Tokenizer) -> None:
    assert tok.encode("ab", max_id=511) == tok.encode("ab")
    with pytest.raises(TokenizerError, match=r"expected ids <= 30 .* found id 118 for token 'a'"):
        tok.encode("ab", max_id=30)


def test_wrapper_errors_are_clear(tok: DSV4Tokenizer) -> None:
    with pytest.raises(TokenizerError, match=r"decode: expected ids in \[0, 512\), found \[512\]"):
        tok.decode([5, 512])
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tok.token_to_id("<｜nope｜>")
    with pytest.raises(TokenizerError, match="found -1"):
        tok.id_to_token(-1)
    with pytest.raises(TokenizerError, match="expected str"):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_write_and_load_round_trip(tmp_path: Path, tok: DSV4Tokenizer) -> None:
    file = write_tokenizer(build_tiny_tokenizer(), tmp_path / "ckpt")
    assert file == tmp_path / "ckpt" / "tokenizer.json"
    config = json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["bos_token"] == SPECIAL_TOKENS[0] and config["eos_token"] == SPECIAL_TOKENS[1]
    for path in (tmp_path / "ckpt", file):
        loaded = load_tokenizer(path)
        assert loaded.tokenizer.to_str() == tok.tokenizer.to_str()
        assert (loaded.bos_id, loaded.eos_id, loaded.vocab_size) == (0, 1, tok.vocab_size)
    write_tokenizer(loaded, tmp_path / "again")  # the wrapper is accepted too
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == file.read_bytes()


def test_missing_and_invalid_files_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=f"tokenizer.json at checkpoint directory {tmp_path}"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="nothere.json"):
        load_tokenizer(tmp_path / "nothere.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match=f"{bad} is not a valid tokenizer.json"):
        load_tokenizer(tmp_path)


def test_tokenizer_without_bos_is_rejected(tmp_path: Path) -> None:
    Tokenizer(models.BPE(vocab={"a": 0}, merges=[])).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="expected the special tokens"):
        load_tokenizer(tmp_path)


@pytest.mark.slow
def test_transformers_reads_the_written_directory(tmp_path: Path, tok: DSV4Tokenizer) -> None:
    transformers = pytest.importorskip("transformers")
    write_tokenizer(build_tiny_tokenizer(), tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    prompt = encode_messages([{"role": "user", "content": "Wie spät ist es? 几点了？"}], "thinking")
    assert hf.encode(prompt) == tok.encode(prompt)  # the config must not add a second BOS
    assert hf.decode(tok.encode(prompt)) == prompt
