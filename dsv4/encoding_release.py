"""The chat encoding of each DeepSeek-V4 release: April (``dsv4.encoding``) or the 0731 revision that
the Flash-0731 and Pro-0813 checkpoints ship (spec dsv4-architecture.md §13, source OFF-E2: vLLM's
``deepseek_v4_encoding.py``). One door: ``encode_for_release``; ``release_of(config)`` says which
release a checkpoint is (its DSpark keys mark 0731/0813).

What 0731 changed: reasoning effort is a table ``low`` (no text, the default) / ``high`` (the April
``max`` paragraph) / ``max`` (a new "Beyond maximum" paragraph): every April level moved down one, so
the same word means another prompt, and a prompt made for the other release is another prompt. The
0731 encoder also reads the assistant's reasoning from ``reasoning`` (vLLM's message field) as well
as ``reasoning_content``. Everything else renders as in April (the published goldens in
``tests/dsv4/encoding_0731`` pass through the April renderer). Compute-free: the reference may import it.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from .encoding import BOS_TOKEN, REASONING_EFFORT_MAX, EncodingError, encode_messages

RELEASES = ("april", "0731")

# The 0731 "max" paragraph: prompt text the model was trained on, byte-exact (OFF-E2).
REASONING_EFFORT_BEYOND = (
    "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
)
EFFORT_PROMPTS_0731 = {"low": "", "high": REASONING_EFFORT_MAX, "max": REASONING_EFFORT_BEYOND}
EFFORTS = {"april": (None, "high", "max"), "0731": (None, "low", "high", "max")}


def release_of(config: Any) -> str:
    """'0731' for a checkpoint with a DSpark draft (Flash-0731, Pro-0813), else 'april'."""
    return "0731" if getattr(config, "dspark_block_size", 0) else "april"


def _check(release: str, reasoning_effort: str | None) -> None:
    if release not in RELEASES:
        raise EncodingError(f"release: expected one of {list(RELEASES)}, found {release!r}")
    if reasoning_effort not in EFFORTS[release]:
        other = next(r for r in RELEASES if r != release)
        where = f" (a {other} level)" if reasoning_effort in EFFORTS[other] else ""
        raise EncodingError(f"reasoning_effort: the {release} encoding accepts {list(EFFORTS[release])}, found "
                            f"{reasoning_effort!r}{where}; the prompt is encoded for the {release} release")


def _reasoning_alias(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if "reasoning" in m:
            r = m.pop("reasoning")
            if "reasoning_content" in m and m["reasoning_content"] != r:
                raise EncodingError(f"message {i}: reasoning and reasoning_content differ; expected one of them")
            m["reasoning_content"] = r
        out.append(m)
    return out


def encode_for_release(messages: Sequence[Mapping[str, Any]], thinking_mode: str, release: str,
                       reasoning_effort: str | None = None,
                       context: Sequence[Mapping[str, Any]] | None = None, drop_thinking: bool = True,
                       add_default_bos_token: bool = True) -> str:
    """The prompt string of ``messages`` in ``release``'s encoding (see the module docstring)."""
    _check(release, reasoning_effort)
    if release == "april":
        return encode_messages(messages, thinking_mode, context, drop_thinking, add_default_bos_token,
                               reasoning_effort)
    text = encode_messages(_reasoning_alias(messages), thinking_mode, _reasoning_alias(context or []),
                           drop_thinking, add_default_bos_token)
    effort = EFFORT_PROMPTS_0731[reasoning_effort or "low"]
    if effort and thinking_mode == "thinking" and not context:   # before the first message, as April's
        at = len(BOS_TOKEN) if add_default_bos_token else 0
        text = text[:at] + effort + text[at:]
    return text


def check_prompt_release(text: str, release: str) -> None:
    """Refuse a prompt that carries another release's effort paragraph, naming both releases."""
    if release not in RELEASES:
        raise EncodingError(f"release: expected one of {list(RELEASES)}, found {release!r}")
    if release == "april" and REASONING_EFFORT_BEYOND[:40] in text:
        raise EncodingError("prompt: encoded for the 0731 release (its 'Reasoning Effort: Beyond maximum' "
                            "paragraph), but the checkpoint is the april release")
