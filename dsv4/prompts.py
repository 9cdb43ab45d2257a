"""The standard parity prompt set (``dsv4/data/prompts.toml``): every command and test uses it.

Each prompt is a chat conversation plus its mode; ``render()`` gives the exact prompt string via
the official encoding, so a prompt id names the same token sequence everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from dsv4.encoding import THINKING_MODES, EncodingError, encode_messages

import tomllib


class PromptSetError(ValueError):
    """A malformed prompt set; the message names the file, the prompt id and what was expected."""


@dataclass(frozen=True)
class Prompt:
    id: str
    mode: str  # "chat" or "thinking" (the encoder's thinking_mode)
    messages: tuple[Mapping[str, Any], ...]

    def render(self) -> str:
        return encode_messages([dict(m) for m in self.messages], thinking_mode=self.mode)


def default_prompt_path() -> Path:
    return Path(str(resources.files("dsv4").joinpath("data").joinpath("prompts.toml")))


def holdout_prompt_path() -> Path:
    """The hold-out set: no prompt shared with the standard one (bug zoo runs, real-model calibration)."""
    return default_prompt_path().with_name("prompts_holdout.toml")


def calibration_prompt_path() -> Path:
    """The trained built-in model's calibration set: no prompt shared with the standard or hold-out set."""
    return default_prompt_path().with_name("prompts_calibration.toml")


def shipped_prompt_set(name_or_path: str | Path) -> Path:
    """A prompt-set path, or the bare file name of a shipped set (as thresholds files record them)."""
    p = Path(name_or_path)
    return p if p.is_absolute() or p.exists() else default_prompt_path().with_name(str(name_or_path))


def load_prompt_set(path: str | Path | None = None) -> list[Prompt]:
    """Read and validate a prompt set; every prompt must render with the encoder."""
    path = Path(path) if path is not None else default_prompt_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise PromptSetError(f"prompt set: expected a TOML file at {path}, found none") from err
    except tomllib.TOMLDecodeError as err:
        raise PromptSetError(f"prompt set {path}: invalid TOML ({err})") from err
    entries = data.get("prompts")
    if not isinstance(entries, list) or not entries:
        raise PromptSetError(f"prompt set {path}: expected a non-empty [[prompts]] array, found {entries!r}")

    prompts: list[Prompt] = []
    seen: set[str] = set()
    for n, entry in enumerate(entries):
        pid = entry.get("id")
        where = f"prompt set {path}, prompt {pid!r} (#{n})"
        if not isinstance(pid, str) or not pid or pid in seen:
            raise PromptSetError(f"{where}: expected a unique non-empty string id, found {pid!r}")
        seen.add(pid)
        if entry.get("mode") not in THINKING_MODES:
            raise PromptSetError(f"{where}: expected mode in {list(THINKING_MODES)}, found {entry.get('mode')!r}")
        messages = entry.get("messages")
        if not isinstance(messages, list) or not messages:
            raise PromptSetError(f"{where}: expected a non-empty messages list, found {messages!r}")
        prompt = Prompt(id=pid, mode=entry["mode"], messages=tuple(dict(m) for m in messages))
        try:
            prompt.render()
        except EncodingError as err:
            raise PromptSetError(f"{where}: {err}") from err
        prompts.append(prompt)
    return prompts
