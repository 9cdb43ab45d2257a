"""Tokenizers for DeepSeek-V4: load a checkpoint's ``tokenizer.json`` or build the tiny test one.

Compute-free (no torch): the reference model may import it. Special strings are matched as single
tokens wherever they occur in the text (spec dsv4-architecture.md §13); the chat encoder
(:mod:`dsv4.encoding`) writes them as plain strings and this module turns them into ids.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from dsv4.encoding import (ASSISTANT_TOKEN, BOS_TOKEN, DSML_INVOKE_CLOSE, DSML_INVOKE_OPEN,
                           DSML_PARAMETER_CLOSE, DSML_PARAMETER_OPEN, DSML_TOOL_CALLS_CLOSE,
                           DSML_TOOL_CALLS_OPEN, EOS_TOKEN, LATEST_REMINDER_TOKEN, TASK_TOKENS,
                           THINK_END, THINK_START, TOOL_RESULT_END, TOOL_RESULT_START, USER_TOKEN)

# Order = ids in the tiny tokenizer: BOS 0 and EOS 1 as in the real config. Whether the real V4
# vocabulary holds the DSML fragments and <tool_result> as single tokens is not settled by the
# sources (§17); the tiny one does, which only changes how many ids a prompt takes.
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS_TOKEN, EOS_TOKEN, USER_TOKEN, ASSISTANT_TOKEN, LATEST_REMINDER_TOKEN, THINK_START, THINK_END,
    DSML_TOOL_CALLS_OPEN, DSML_TOOL_CALLS_CLOSE, DSML_INVOKE_OPEN, DSML_INVOKE_CLOSE,
    DSML_PARAMETER_OPEN, DSML_PARAMETER_CLOSE, TOOL_RESULT_START, TOOL_RESULT_END,
    *TASK_TOKENS.values(),
)

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# Word pieces the tiny tokenizer learns merges for, most frequent first, so common English takes
# fewer ids than bytes (as with a real BPE). Fixed data: changing it changes every tiny fingerprint.
_MERGE_WORDS: tuple[str, ...] = (
    " the", " and", " of", " to", " in", " is", " a", " that", " for", " it", " with", " as",
    " on", " be", " this", " are", " you", " what", " how", " why", " can", " an", " or", " by",
    " not", " from", " at", " which", " one", " two", " three", " ten", " number", " numbers",
    " answer", " question", " function", " write", " explain", " please", " should", " would",
    " your", " about", " their", " there", " when", " then", " than", " more", " each", " time",
    " step", " first", " second", " list", " short", " give", " does", " do", " use", " make",
    " sentence", " words", " word", " Python", " code", " small", " large", " we", " will", " if",
    "The", "What", "How", "Why", "You", " I", "ing", "ed", "er", "tion", "es", "ly", "'s", "\n\n",
    ". ", ", ", "?", "th", "he", "re", "in", "an", "on", "en", "at", "or", "st", "nd", "al",
)


class TokenizerError(ValueError):
    """A missing or invalid tokenizer, or text/ids it cannot handle; the message names the path or id."""


def _byte_to_char() -> dict[int, str]:
    """The GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100 + n."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _bpe_segment(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Apply merges lowest rank first, as tokenizers' BPE model does."""
    while len(symbols) > 1:
        pairs = [(ranks.get((a, b)), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
        ranked = [(r, i) for r, i in pairs if r is not None]
        if not ranked:
            break
        _, i = min(ranked)
        symbols = symbols[:i] + [symbols[i] + symbols[i + 1]] + symbols[i + 2:]
    return symbols


def build_tiny_tokenizer(vocab_size: int = 512, *, fill: bool = False) -> Tokenizer:
    """A deterministic byte-level BPE: specials (BOS 0, EOS 1, ...), 256 byte symbols, merges.

    Any UTF-8 text round-trips. The vocabulary never exceeds ``vocab_size``; with ``fill`` it is
    exactly ``vocab_size``: ids no merge reaches get placeholder tokens ``<|synth_ID|>``, so a
    synthetic checkpoint of any width decodes every id its model can emit. The same call always
    gives a byte-identical ``to_str()``.
    """
    minimum = len(SPECIAL_TOKENS) + 256
    if vocab_size < minimum:
        raise TokenizerError(f"vocab_size: expected >= {minimum} (specials + 256 bytes), found {vocab_size}")
    byte_chars = _byte_to_char()
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({byte_chars[b]: len(SPECIAL_TOKENS) + b for b in range(256)})
    merges: list[tuple[str, str]] = []
    ranks: dict[tuple[str, str], int] = {}
    for word in _MERGE_WORDS:
        symbols = _bpe_segment([byte_chars[b] for b in word.encode("utf-8")], ranks)
        while len(symbols) > 1:
            merged = symbols[0] + symbols[1]
            if merged not in vocab:
                if len(vocab) >= vocab_size:
                    break
                vocab[merged] = len(vocab)
            ranks[(symbols[0], symbols[1])] = len(merges)
            merges.append((symbols[0], symbols[1]))
            symbols = _bpe_segment(symbols, ranks)
    if fill:
        for i in range(len(vocab), vocab_size):
            vocab[f"<|synth_{i}|>"] = i   # ASCII: the byte-level decoder maps it to itself

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


class DSV4Tokenizer:
    """A thin, validating wrapper over ``tokenizers.Tokenizer`` (no BOS/EOS added implicitly)."""

    def __init__(self, tokenizer: Tokenizer, source: str = "<in memory>") -> None:
        self.tokenizer = tokenizer
        self.source = source
        ids = {t: tokenizer.token_to_id(t) for t in (BOS_TOKEN, EOS_TOKEN)}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise TokenizerError(f"tokenizer {source}: expected the special tokens {missing} in its "
                                 f"vocabulary, found none")
        self.bos_id: int = ids[BOS_TOKEN]
        self.eos_id: int = ids[EOS_TOKEN]
        unk = getattr(tokenizer.model, "unk_token", None)
        self._unk_id = tokenizer.token_to_id(unk) if unk else None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, max_id: int | None = None) -> list[int]:
        """Token ids of ``text``; special strings become their single ids.

        ``max_id`` is the largest id the model accepts (its vocab_size - 1); a larger id raises.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode: expected str, found {type(text).__name__}")
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        if self._unk_id is not None and self._unk_id in enc.ids:
            pos = enc.ids.index(self._unk_id)
            start, end = enc.offsets[pos]
            raise TokenizerError(f"encode: tokenizer {self.source} has no token for {text[start:end]!r} "
                                 f"(offset {start}); it became the unknown token")
        if max_id is not None:
            over = [(i, t) for i, t in zip(enc.ids, enc.tokens) if i > max_id]
            if over:
                raise TokenizerError(f"encode: expected ids <= {max_id} (the model vocabulary), found "
                                     f"id {over[0][0]} for token {over[0][1]!r} ({len(over)} such ids)")
        return list(enc.ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens included (so encode/decode round-trips)."""
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(f"decode: expected ids in [0, {self.vocab_size}), found {bad[:5]}")
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int:
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise TokenizerError(f"token_to_id: {token!r} is not in the vocabulary of {self.source}")
        return found

    def id_to_token(self, token_id: int) -> str:
        found = self.tokenizer.id_to_token(token_id) if token_id >= 0 else None
        if found is None:
            raise TokenizerError(f"id_to_token: expected an id in [0, {self.vocab_size}), found {token_id}")
        return found

    def special_ids(self, tokens: Iterable[str] = SPECIAL_TOKENS) -> dict[str, int]:
        """Ids of the special strings this vocabulary holds as single tokens."""
        return {t: i for t in tokens if (i := self.tokenizer.token_to_id(t)) is not None}


def check_tokenizer_matches(config: Any, tokenizer: "DSV4Tokenizer") -> None:
    """The tokenizer must fit the model before any compute: every id it produces indexes the
    embedding (size <= vocab_size), its BOS/EOS are the config's, and it decodes every id the model
    can emit (size == vocab_size, or a real release's tokenizer padded by < 1 % of the vocabulary)."""
    V, n = config.vocab_size, tokenizer.vocab_size
    where = f"tokenizer {tokenizer.source} vs config '{config.name}'"
    if n > V:
        raise TokenizerError(f"{where}: expected at most vocab_size={V} tokens (ids index the embedding), found {n}")
    if (tokenizer.bos_id, tokenizer.eos_id) != (config.bos_token_id, config.eos_token_id):
        raise TokenizerError(f"{where}: expected BOS/EOS ids {config.bos_token_id}/{config.eos_token_id} (config), "
                             f"found {tokenizer.bos_id}/{tokenizer.eos_id}")
    if n < V * 0.99:
        raise TokenizerError(f"{where}: expected a tokenizer for this model's {V} ids, found one of {n} tokens "
                             f"(the model can emit ids its tokenizer cannot decode: the wrong tokenizer.json?)")


def tiny_tokenizer(vocab_size: int = 512) -> DSV4Tokenizer:
    return DSV4Tokenizer(build_tiny_tokenizer(vocab_size), source=f"tiny(vocab_size={vocab_size})")


def load_tokenizer(path: str | Path) -> DSV4Tokenizer:
    """Load ``tokenizer.json`` from a checkpoint directory, or a tokenizer.json file; offline only."""
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        where = f"checkpoint directory {path}" if path.is_dir() else str(path)
        raise TokenizerError(f"tokenizer: expected {TOKENIZER_FILE} at {where}, found no such file")
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception for malformed JSON or models
        raise TokenizerError(f"tokenizer: {file} is not a valid tokenizer.json ({err})") from err
    return DSV4Tokenizer(tok, source=str(file))


def write_tokenizer(tokenizer: Tokenizer | DSV4Tokenizer, directory: str | Path) -> Path:
    """Save ``tokenizer.json`` and a minimal ``tokenizer_config.json``; returns the tokenizer.json path."""
    tok = tokenizer.tokenizer if isinstance(tokenizer, DSV4Tokenizer) else tokenizer
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / TOKENIZER_FILE
    tok.save(str(file))
    # The encoder writes BOS itself, so loaders must not add one (transformers' _v4_chat does the same).
    config = {"add_bos_token": False, "add_eos_token": False, "bos_token": BOS_TOKEN,
              "eos_token": EOS_TOKEN, "clean_up_tokenization_spaces": False,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                                   encoding="utf-8")
    return file
