"""DeepSeek-V4 chat encoding: messages -> prompt string, and completion text -> assistant message.

Implements the April release of the official ``encoding/encoding_dsv4.py`` (spec
dsv4-architecture.md §13, source OFF-E) and must produce byte-identical prompts. Compute-free
and dependency-free: the reference model may import it.

Differences of the later "0731" revision (OFF-E2, shipped as vLLM's ``deepseek_v4_encoding.py``),
which this module does not implement (``dsv4.encoding_release`` renders them on top of it):
  * reasoning_effort becomes a table {low: "", high: the April "max" paragraph, max: a new
    "Reasoning Effort: Beyond maximum..." paragraph} with default "low"; April accepts only
    None / "high" / "max" and only "max" adds text.
  * vLLM's copy reads the assistant's reasoning from ``reasoning`` instead of
    ``reasoning_content``, lets a trailing system message open an assistant turn, and passes
    ``last_user_idx`` explicitly.
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any, Mapping, Sequence

BOS_TOKEN = "<｜begin▁of▁sentence｜>"
EOS_TOKEN = "<｜end▁of▁sentence｜>"
USER_TOKEN = "<｜User｜>"
ASSISTANT_TOKEN = "<｜Assistant｜>"
LATEST_REMINDER_TOKEN = "<｜latest_reminder｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"
TOOL_RESULT_START = "<tool_result>"
TOOL_RESULT_END = "</tool_result>"
# The DSML tag fragments the encoder writes and the parser anchors on.
DSML_TOOL_CALLS_OPEN = f"<{DSML}tool_calls>"
DSML_TOOL_CALLS_CLOSE = f"</{DSML}tool_calls>"
DSML_INVOKE_OPEN = f"<{DSML}invoke"
DSML_INVOKE_CLOSE = f"</{DSML}invoke>"
DSML_PARAMETER_OPEN = f"<{DSML}parameter"
DSML_PARAMETER_CLOSE = f"</{DSML}parameter>"
TASK_TOKENS: dict[str, str] = {
    "action": "<｜action｜>", "query": "<｜query｜>", "authority": "<｜authority｜>",
    "domain": "<｜domain｜>", "title": "<｜title｜>", "read_url": "<｜read_url｜>",
}

THINKING_MODES = ("chat", "thinking")
REASONING_EFFORTS = (None, "high", "max")
ROLES = ("system", "user", "developer", "assistant", "latest_reminder", "tool")

# Prompt text is data the model was trained on: these strings must stay byte-exact (OFF-E).
REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

RESPONSE_FORMAT_TEMPLATE = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{schema}"
)

TOOLS_TEMPLATE = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "{DSML_TOOL_CALLS_OPEN}" block like the following:

{DSML_TOOL_CALLS_OPEN}
{DSML_INVOKE_OPEN} name="$TOOL_NAME">
{DSML_PARAMETER_OPEN} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{DSML_PARAMETER_CLOSE}
...
{DSML_INVOKE_CLOSE}
{DSML_INVOKE_OPEN} name="$TOOL_NAME2">
...
{DSML_INVOKE_CLOSE}
{DSML_TOOL_CALLS_CLOSE}

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete reasoning inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.

Otherwise, output directly after {THINK_END} with tool calls or final response.

### Available Tool Schemas

{{tool_schemas}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""

# Roles that survive drop_thinking wherever they sit (OFF-E keeps "direct_search_results" too,
# a role it cannot render; unknown roles are rejected before this point here).
_DROP_KEEP_ROLES = frozenset({"user", "system", "tool", "latest_reminder"})


class EncodingError(ValueError):
    """Invalid chat input or malformed completion text; the message names expected and found."""


def _to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _check_choice(name: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise EncodingError(f"{name}: expected one of {list(allowed)}, found {value!r}")


def _text(value: Any, where: str) -> str:
    """Message text; None renders as "" (as OFF-E does for system/user/assistant content; OFF-E
    would write a None latest_reminder as the literal "None")."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise EncodingError(f"{where}: expected a string, found {type(value).__name__}")
    return value


# ---------------------------------------------------------------------------------------------
# Tools and tool calls
# ---------------------------------------------------------------------------------------------

def render_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools section for OpenAI-format tools ({"type": "function", "function": {...}})."""
    try:
        schemas = [_to_json(tool["function"]) for tool in tools]
    except (KeyError, TypeError) as err:
        raise EncodingError(f"tools: expected OpenAI-format entries with a 'function' key ({err})")
    return TOOLS_TEMPLATE.format(tool_schemas="\n".join(schemas))


def _tool_call_arguments(raw: Any) -> dict[str, Any]:
    # OFF-E: arguments that do not parse as JSON (a non-string included) become one parameter
    # named "arguments"; the later revision accepts a dict as the mapping itself.
    try:
        parsed = json.loads(raw)
    except Exception:
        return {"arguments": raw}
    if not isinstance(parsed, dict):
        raise EncodingError(f"tool call arguments: expected a JSON object, found {raw!r}")
    return parsed


def _render_tool_calls(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    invokes = []
    for call in tool_calls:
        try:
            name, raw_args = call["function"]["name"], call["function"]["arguments"]
        except (KeyError, TypeError) as err:
            raise EncodingError(f"tool_calls: expected OpenAI-format calls "
                                f"{{'function': {{'name', 'arguments'}}}}, found {call!r} ({err})")
        params = "\n".join(
            f'{DSML_PARAMETER_OPEN} name="{key}" string="{"true" if isinstance(v, str) else "false"}">'
            f'{v if isinstance(v, str) else _to_json(v)}{DSML_PARAMETER_CLOSE}'
            for key, v in _tool_call_arguments(raw_args).items())
        invokes.append(f'{DSML_INVOKE_OPEN} name="{name}">\n{params}\n{DSML_INVOKE_CLOSE}')
    return "\n\n" + DSML_TOOL_CALLS_OPEN + "\n" + "\n".join(invokes) + "\n" + DSML_TOOL_CALLS_CLOSE


def _render_tool_result(content: Any) -> str:
    if isinstance(content, list):
        content = "\n\n".join(block.get("text", "") if block.get("type") == "text"
                              else f"[Unsupported {block.get('type')}]" for block in content)
    return TOOL_RESULT_START + _text(content, "tool result content") + TOOL_RESULT_END


# ---------------------------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------------------------

def merge_tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Fold ``role: "tool"`` messages into user messages as ``content_blocks`` (V4 has no tool role).

    Consecutive tool results and user texts accumulate in one user message (unless that message
    carries a ``task``); user messages keep only content, content_blocks, task, wo_eos and mask.
    """
    merged: list[dict[str, Any]] = []
    for original in messages:
        msg = copy.deepcopy(dict(original))
        role = msg.get("role")
        last = merged[-1] if merged else None
        open_user = last is not None and last.get("role") == "user" and "content_blocks" in last
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": msg.get("tool_call_id", ""),
                     "content": msg.get("content", "")}
            if open_user:
                last["content_blocks"].append(block)
            else:
                merged.append({"role": "user", "content_blocks": [block]})
        elif role == "user":
            block = {"type": "text", "text": msg.get("content", "")}
            if open_user and last.get("task") is None:
                last["content_blocks"].append(block)
            else:
                new = {"role": "user", "content": msg.get("content", ""), "content_blocks": [block]}
                new.update({k: msg[k] for k in ("task", "wo_eos", "mask") if k in msg})
                merged.append(new)
        else:
            merged.append(msg)
    return merged


def sort_tool_results_by_call_order(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reorder each user message's tool results to the order of the latest assistant tool calls.

    Text blocks keep their slots; results with unknown ids sort as position 0 (stable).
    """
    order: dict[str, int] = {}
    for msg in messages:
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            order = {}
            for pos, call in enumerate(msg["tool_calls"]):
                call_id = call.get("id") or call.get("function", {}).get("id", "")
                if call_id:
                    order[call_id] = pos
        elif msg.get("role") == "user" and msg.get("content_blocks"):
            results = [b for b in msg["content_blocks"] if b.get("type") == "tool_result"]
            if len(results) > 1 and order:
                ranked = iter(sorted(results, key=lambda b: order.get(b.get("tool_use_id", ""), 0)))
                msg["content_blocks"] = [next(ranked) if b.get("type") == "tool_result" else b
                                         for b in msg["content_blocks"]]
    return messages


def _last_user_index(messages: Sequence[Mapping[str, Any]]) -> int:
    for idx in range(len(messages) - 1, -1, -1):
        if messages[idx].get("role") in ("user", "developer"):
            return idx
    return -1


def _drop_thinking(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Before the last user/developer turn: strip assistant reasoning and drop developer turns."""
    last_user = _last_user_index(messages)
    kept = []
    for idx, msg in enumerate(messages):
        role = msg.get("role")
        if role in _DROP_KEEP_ROLES or idx >= last_user:
            kept.append(msg)
        elif role == "assistant":
            kept.append({k: v for k, v in msg.items() if k != "reasoning_content"})
    return kept


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

def _render_body(idx: int, messages: list[dict[str, Any]], thinking: bool, drop_thinking: bool,
                 last_user: int) -> str:
    msg = messages[idx]
    role = msg.get("role")
    where = f"message {idx} ({role})"
    if role in ("system", "developer"):
        content = _text(msg.get("content"), f"{where} content")
        if role == "developer" and not content:
            raise EncodingError(f"{where}: expected non-empty content, found {msg.get('content')!r}")
        out = (USER_TOKEN if role == "developer" else "") + content
        if msg.get("tools"):
            out += "\n\n" + render_tools(msg["tools"])
        if msg.get("response_format"):
            out += "\n\n" + RESPONSE_FORMAT_TEMPLATE.format(schema=_to_json(msg["response_format"]))
        return out
    if role == "user":
        blocks = msg.get("content_blocks")
        if not blocks:
            return USER_TOKEN + _text(msg.get("content"), f"{where} content")
        parts = []
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                parts.append(_text(block.get("text", ""), f"{where} text block"))
            elif kind == "tool_result":
                parts.append(_render_tool_result(block.get("content", "")))
            else:
                parts.append(f"[Unsupported {kind}]")
        return USER_TOKEN + "\n\n".join(parts)
    if role == "latest_reminder":
        return LATEST_REMINDER_TOKEN + _text(msg.get("content"), f"{where} content")
    if role == "assistant":
        reasoning = ""
        # An assistant turn answering a task message carries no think block (OFF-E).
        after_task = idx > 0 and messages[idx - 1].get("task") is not None
        if thinking and not after_task and (not drop_thinking or idx > last_user):
            reasoning = _text(msg.get("reasoning_content"), f"{where} reasoning_content") + THINK_END
        calls = _render_tool_calls(msg["tool_calls"]) if msg.get("tool_calls") else ""
        eos = "" if msg.get("wo_eos", False) else EOS_TOKEN
        return reasoning + _text(msg.get("content"), f"{where} content") + calls + eos
    raise EncodingError(f"{where}: expected role in {list(ROLES[:-1])} after merging tool "
                        f"messages, found {role!r}")


def _render_transition(idx: int, messages: list[dict[str, Any]], thinking: bool,
                       drop_thinking: bool, last_user: int) -> str:
    """What follows a message that ends the prompt or precedes an assistant/reminder turn."""
    if idx + 1 < len(messages) and messages[idx + 1].get("role") not in ("assistant", "latest_reminder"):
        return ""
    msg = messages[idx]
    task = msg.get("task")
    if task is not None:
        _check_choice(f"message {idx} task", task, list(TASK_TOKENS))
        if task != "action":
            return TASK_TOKENS[task]
        return ASSISTANT_TOKEN + (THINK_START if thinking else THINK_END) + TASK_TOKENS[task]
    if msg.get("role") in ("user", "developer"):
        opens_thinking = thinking and (not drop_thinking or idx >= last_user)
        return ASSISTANT_TOKEN + (THINK_START if opens_thinking else THINK_END)
    return ""


def _validate_messages(name: str, messages: Any) -> None:
    if not isinstance(messages, (list, tuple)):
        raise EncodingError(f"{name}: expected a list of message dicts, found {type(messages).__name__}")
    for idx, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise EncodingError(f"{name}[{idx}]: expected a dict, found {type(msg).__name__}")
        _check_choice(f"{name}[{idx}] role", msg.get("role"), ROLES)


def encode_messages(messages: Sequence[Mapping[str, Any]], thinking_mode: str,
                    context: Sequence[Mapping[str, Any]] | None = None, drop_thinking: bool = True,
                    add_default_bos_token: bool = True, reasoning_effort: str | None = None) -> str:
    """Render ``messages`` (after an already-encoded ``context``) as a DeepSeek-V4 prompt string.

    Chat prompts end ``<｜Assistant｜></think>``, thinking prompts ``<｜Assistant｜><think>``.
    BOS is emitted only without context. Any message defining ``tools`` forces drop_thinking off.
    """
    _check_choice("thinking_mode", thinking_mode, THINKING_MODES)
    _check_choice("reasoning_effort", reasoning_effort, REASONING_EFFORTS)
    context = list(context or [])
    _validate_messages("messages", messages)
    _validate_messages("context", context)

    # Merged separately (a leading tool message never folds into the context), sorted together.
    ctx = merge_tool_messages(context)
    full = sort_tool_results_by_call_order(ctx + merge_tool_messages(messages))
    thinking = thinking_mode == "thinking"
    drop = drop_thinking and not any(m.get("tools") for m in full)

    if thinking and drop:
        full = _drop_thinking(full)
        # OFF-E measures the context by dropping it on its own; kept as is for identical output.
        start = len(_drop_thinking(ctx))
    else:
        start = len(ctx)

    last_user = _last_user_index(full)
    prompt = BOS_TOKEN if add_default_bos_token and not context else ""
    for idx in range(start, len(full)):
        if idx == 0 and thinking and reasoning_effort == "max":
            prompt += REASONING_EFFORT_MAX
        prompt += _render_body(idx, full, thinking, drop, last_user)
        prompt += _render_transition(idx, full, thinking, drop, last_user)
    return prompt


# ---------------------------------------------------------------------------------------------
# Parsing a completion (one assistant turn, generated after the prompt)
# ---------------------------------------------------------------------------------------------

_TOOL_CALLS_START = "\n\n" + DSML_TOOL_CALLS_OPEN
# Names stay on one line so a malformed tag cannot swallow the tags after it.
_INVOKE_HEAD = re.compile(re.escape(DSML_INVOKE_OPEN) + r' name="([^\n]*?)">\n')
_PARAMETER_HEAD = re.compile(re.escape(DSML_PARAMETER_OPEN) + r' name="([^\n]*?)" string="(true|false)">')
# Like OFF-E, a value ends at the first "/｜DSML｜parameter", which must be a complete close tag.
_PARAMETER_END = "/" + DSML + "parameter"


def _expect(text: str, pos: int, literal: str, what: str) -> int:
    if not text.startswith(literal, pos):
        raise EncodingError(f"completion {what}: expected {literal!r} at offset {pos}, "
                            f"found {text[pos:pos + len(literal) + 20]!r}")
    return pos + len(literal)


def _parse_tool_calls(text: str, pos: int) -> tuple[int, list[dict[str, Any]]]:
    """Parse the DSML block body after ``<｜DSML｜tool_calls>`` up to and including its close tag."""
    calls: list[dict[str, Any]] = []
    pos = _expect(text, pos, "\n", "tool calls")
    while not text.startswith(DSML_TOOL_CALLS_CLOSE, pos):
        head = _INVOKE_HEAD.match(text, pos)
        if head is None:
            raise EncodingError(f"completion tool calls: expected '{DSML_INVOKE_OPEN} name=\"...\">\\n' "
                                f"at offset {pos}, found {text[pos:pos + 40]!r}")
        name, pos = head.group(1), head.end()
        args: dict[str, str] = {}
        params = 0
        while (param := _PARAMETER_HEAD.match(text, pos)) is not None:
            key, is_str = param.groups()
            end = text.find(_PARAMETER_END, param.end())
            if end < 1 or not text.startswith(DSML_PARAMETER_CLOSE, end - 1):
                raise EncodingError(f"completion tool call {name!r}: expected parameter {key!r} closed "
                                    f"by {DSML_PARAMETER_CLOSE!r}, found {text[param.end():][:60]!r}")
            if key in args:
                raise EncodingError(f"completion tool call {name!r}: duplicate parameter {key!r}")
            value = text[param.end():end - 1]
            # String values are raw text; others are JSON literals copied verbatim.
            args[key] = _to_json(value) if is_str == "true" else value
            pos = _expect(text, end - 1 + len(DSML_PARAMETER_CLOSE), "\n", f"tool call {name!r}")
            params += 1
        if params == 0 and text.startswith("\n", pos):
            pos += 1  # the encoder writes an empty parameter line; OFF-E also accepts none
        pos = _expect(text, pos, DSML_INVOKE_CLOSE + "\n", f"tool call {name!r}")
        arguments = "{" + ", ".join(f"{_to_json(k)}: {v}" for k, v in args.items()) + "}"
        calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
    return pos + len(DSML_TOOL_CALLS_CLOSE), calls


def parse_message_from_completion_text(text: str, thinking_mode: str) -> dict[str, Any]:
    """Split a completion (ending in EOS) into reasoning_content, content and OpenAI tool_calls."""
    _check_choice("thinking_mode", thinking_mode, THINKING_MODES)
    reasoning, pos = "", 0
    if thinking_mode == "thinking":
        end = text.find(THINK_END)
        calls_at = text.find(_TOOL_CALLS_START)
        if end < 0 or 0 <= calls_at < end:
            raise EncodingError(f"completion: expected reasoning closed by {THINK_END!r}, found none")
        reasoning, pos = text[:end], end + len(THINK_END)

    eos_at, calls_at = text.find(EOS_TOKEN, pos), text.find(_TOOL_CALLS_START, pos)
    tool_calls: list[dict[str, Any]] = []
    if calls_at >= 0 and (eos_at < 0 or calls_at < eos_at):
        content = text[pos:calls_at]
        pos, tool_calls = _parse_tool_calls(text, calls_at + len(_TOOL_CALLS_START))
        # OFF-E accepts a tool-call completion whose EOS was already stripped.
        if text.startswith(EOS_TOKEN, pos):
            pos += len(EOS_TOKEN)
    elif eos_at >= 0:
        content, pos = text[pos:eos_at], eos_at + len(EOS_TOKEN)
    else:
        raise EncodingError(f"completion: expected {EOS_TOKEN!r} at the end, found none")
    if pos != len(text):
        raise EncodingError(f"completion: expected nothing after EOS, found {text[pos:pos + 40]!r}")
    for token in (BOS_TOKEN, EOS_TOKEN, THINK_START, THINK_END, DSML):
        if token in content or token in reasoning:
            raise EncodingError(f"completion: special string {token!r} inside content or reasoning")
    return {"role": "assistant", "content": content, "reasoning_content": reasoning,
            "tool_calls": tool_calls}
