"""A byte-level BPE trained with ``tokenizers`` on the corpus, the DeepSeek-V4 special tokens of
``dsv4.encoding`` first (BOS 0, EOS 1, ... in the order of dsv4.tokenizer.SPECIAL_TOKENS), so chat
and thinking prompts encode as they do with the tiny tokenizer: specials as single ids."""
from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dsv4.tokenizer import SPECIAL_TOKENS, DSV4Tokenizer


def train_bpe(texts: Iterable[str], vocab_size: int) -> DSV4Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(list(texts), trainer=trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"bpe: expected special token {s!r} at id {i}, found {tok.token_to_id(s)}")
    return DSV4Tokenizer(tok, source="trained byte-level BPE")
