"""Prompts as the harness feeds them: selected from the standard prompt set (or given as text) and
encoded with the checkpoint's tokenizer, validated against the model vocabulary."""
from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from dsv4.encoding import THINKING_MODES, EncodingError
from dsv4.prompts import Prompt, PromptSetError, load_prompt_set
from dsv4.tokenizer import DSV4Tokenizer, TokenizerError

from .errors import PromptError


@dataclass(frozen=True)
class EncodedPrompt:
    id: str
    mode: str
    text: str
    ids: tuple[int, ...]

    def tensor(self) -> torch.Tensor:
        return torch.tensor(self.ids, dtype=torch.int64)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


def custom_prompt(text: str, mode: str) -> Prompt:
    """A free-text user message, rendered in ``mode``; its id is stable (a hash of mode and text)."""
    digest = hashlib.sha256(f"{mode}\0{text}".encode()).hexdigest()[:8]
    return Prompt(id=f"custom-{digest}", mode=mode, messages=({"role": "user", "content": text},))


_ID_LIKE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)+")


def select_prompts(mode: str, requested: Sequence[str] | None = None,
                   prompt_set: str | Path | None = None) -> list[Prompt]:
    """``requested`` entries are prompt ids of the set, or else free text for a user message. With
    none, every prompt of the set in ``mode``. A set prompt of the other mode is an error."""
    if mode not in THINKING_MODES:
        raise PromptError(f"mode: expected one of {list(THINKING_MODES)}, found {mode!r}")
    try:
        prompts = load_prompt_set(prompt_set)
    except PromptSetError as e:
        raise PromptError(str(e)) from None
    if not requested:
        chosen = [p for p in prompts if p.mode == mode]
        if not chosen:
            raise PromptError(f"prompt set has no prompt of mode {mode!r}")
        return chosen
    by_id = {p.id: p for p in prompts}
    out = []
    for r in requested:
        p = by_id.get(r)
        if p is None and _ID_LIKE.fullmatch(r):
            # 'thinking-arith' is a mistyped id, not a question: running it as text hides the typo
            near = difflib.get_close_matches(r, list(by_id), n=3)
            raise PromptError(f"--prompt {r!r}: expected a prompt id of the set (closest: {near or sorted(by_id)[:5]}) "
                              f"or free text (with a space)")
        if p is None:
            out.append(custom_prompt(r, mode))
        elif p.mode != mode:
            raise PromptError(f"prompt {r!r} is a {p.mode!r} prompt, found --mode {mode!r}")
        else:
            out.append(p)
    return out


def encode_prompts(prompts: Sequence[Prompt], tokenizer: DSV4Tokenizer, vocab_size: int, *,
                   reasoning_effort: str | None = None, release: str = "april") -> list[EncodedPrompt]:
    """Encode (in ``release``'s chat encoding, dsv4.encoding_release) and tokenize; with
    ``reasoning_effort`` (thinking prompts only) each id becomes ``id@effort`` so its records and
    cached references never mix with the plain prompt's."""
    from dsv4.encoding_release import encode_for_release

    out = []
    for p in prompts:
        if reasoning_effort is not None and p.mode != "thinking":
            raise PromptError(f"prompt {p.id!r}: --reasoning-effort applies to thinking prompts, found a "
                              f"{p.mode!r} prompt (use --mode thinking)")
        try:
            text = encode_for_release([dict(m) for m in p.messages], p.mode, release, reasoning_effort)
            ids = tokenizer.encode(text, max_id=vocab_size - 1)
        except (EncodingError, TokenizerError) as e:
            raise PromptError(f"prompt {p.id!r}: cannot be encoded for this checkpoint: {e}") from None
        if not ids:
            raise PromptError(f"prompt {p.id!r}: encodes to no tokens")
        pid = p.id if reasoning_effort is None else f"{p.id}@{reasoning_effort}"
        out.append(EncodedPrompt(pid, p.mode, text, tuple(ids)))
    return out
