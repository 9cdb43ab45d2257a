"""Golden strings for the DeepSeek-V4 chat encoder (spec §13, April release of encoding_dsv4.py).

Expected strings are written out literally (not built from the module's constants), so a typo in
a special string or template fails here.
"""
from __future__ import annotations

import copy
import json

import pytest

from dsv4.encoding import (EncodingError, encode_messages, merge_tool_messages,
                           parse_message_from_completion_text)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
U, A = "<｜User｜>", "<｜Assistant｜>"

EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

TOOLS_HEAD = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

"""
TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

GET_TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}
GET_TIME_SCHEMA = ('{"name": "get_time", "description": "Current time", "parameters": {"type": "object", '
                   '"properties": {"tz": {"type": "string"}}}}')


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- single turns -----------------------------------------------------------------------------

def test_chat_single_turn_matches_transformers_v4_chat_template() -> None:
    got = encode_messages([{"role": "user", "content": "What is 2+2?"}], thinking_mode="chat")
    assert got == "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜></think>"


def test_thinking_single_turn_opens_think_block() -> None:
    got = encode_messages([{"role": "user", "content": "What is 2+2?"}], thinking_mode="thinking")
    assert got == "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>"


def test_system_is_raw_text_without_role_token() -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert encode_messages(msgs, "chat") == f"{BOS}Be brief.{U}Hi{A}</think>"


def test_no_bos_when_disabled() -> None:
    got = encode_messages([{"role": "user", "content": "Hi"}], "chat", add_default_bos_token=False)
    assert got == f"{U}Hi{A}</think>"


# --- multi-turn and drop_thinking ------------------------------------------------------------

MULTI = [
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "reasoning_content": "R1", "content": "A1"},
    {"role": "user", "content": "Q2"},
]


def test_thinking_multi_turn_drops_earlier_reasoning_by_default() -> None:
    assert encode_messages(MULTI, "thinking") == f"{BOS}{U}Q1{A}</think>A1{EOS}{U}Q2{A}<think>"


def test_thinking_multi_turn_keeps_reasoning_without_drop_thinking() -> None:
    got = encode_messages(MULTI, "thinking", drop_thinking=False)
    assert got == f"{BOS}{U}Q1{A}<think>R1</think>A1{EOS}{U}Q2{A}<think>"


def test_chat_multi_turn_never_shows_reasoning() -> None:
    assert encode_messages(MULTI, "chat") == f"{BOS}{U}Q1{A}</think>A1{EOS}{U}Q2{A}</think>"


def test_assistant_turn_after_last_user_keeps_reasoning() -> None:
    msgs = MULTI[:2]
    assert encode_messages(msgs, "thinking") == f"{BOS}{U}Q1{A}<think>R1</think>A1{EOS}"


def test_drop_thinking_removes_earlier_developer_messages() -> None:
    msgs = [{"role": "developer", "content": "D"}, {"role": "assistant", "content": "A"},
            {"role": "user", "content": "Q"}]
    assert encode_messages(msgs, "thinking") == f"{BOS}A{EOS}{U}Q{A}<think>"
    assert encode_messages(msgs, "chat") == f"{BOS}{U}D{A}</think>A{EOS}{U}Q{A}</think>"


def test_inputs_are_not_mutated() -> None:
    msgs = copy.deepcopy(MULTI) + [{"role": "tool", "tool_call_id": "x", "content": "r"}]
    before = copy.deepcopy(msgs)
    encode_messages(msgs, "thinking")
    assert msgs == before


# --- tools, tool calls, tool results -----------------------------------------------------------

def test_system_tools_tool_call_and_tool_result() -> None:
    msgs = [
        {"role": "system", "content": "S", "tools": [GET_TIME]},
        {"role": "user", "content": "What time?"},
        {"role": "assistant", "reasoning_content": "Need the clock.", "content": "",
         "tool_calls": [_call("c1", "get_time", '{"tz": "UTC", "fmt": 24}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    expected = (
        f"{BOS}S\n\n{TOOLS_HEAD}{GET_TIME_SCHEMA}{TOOLS_TAIL}"
        f"{U}What time?{A}<think>Need the clock.</think>"
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_time\">\n"
        "<｜DSML｜parameter name=\"tz\" string=\"true\">UTC</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"fmt\" string=\"false\">24</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
        f"{EOS}{U}<tool_result>12:00</tool_result>{A}<think>"
    )
    # Tools force drop_thinking off, so the historical reasoning stays even with the default.
    assert encode_messages(msgs, "thinking") == expected


def test_tool_results_are_joined_with_blank_lines_in_call_order() -> None:
    msgs = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "tool_calls": [_call("c1", "f", "{}"), _call("c2", "g", "{}")]},
        {"role": "tool", "tool_call_id": "c2", "content": "second"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "first"},
                                                          {"type": "image"}]},
        {"role": "user", "content": "Thanks"},
    ]
    got = encode_messages(msgs, "chat")
    calls = ("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n"
             "<｜DSML｜invoke name=\"g\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
    assert got == (f"{BOS}{U}Q{A}</think>{calls}{EOS}"
                   f"{U}<tool_result>first\n\n[Unsupported image]</tool_result>\n\n"
                   f"<tool_result>second</tool_result>\n\nThanks{A}</think>")


def test_merge_tool_messages_folds_tool_role_into_user() -> None:
    merged = merge_tool_messages([{"role": "assistant", "content": "x"},
                                  {"role": "tool", "tool_call_id": "c", "content": "r"},
                                  {"role": "user", "content": "u"}])
    assert [m["role"] for m in merged] == ["assistant", "user"]
    assert merged[1]["content_blocks"] == [
        {"type": "tool_result", "tool_use_id": "c", "content": "r"}, {"type": "text", "text": "u"}]


def test_unparsable_arguments_become_one_string_parameter() -> None:
    msgs = [{"role": "user", "content": "Q"},
            {"role": "assistant", "content": "", "tool_calls": [_call("c", "f", "not json")]}]
    assert ('<｜DSML｜parameter name="arguments" string="true">not json</｜DSML｜parameter>'
            in encode_messages(msgs, "chat"))


def test_response_format_section() -> None:
    msgs = [{"role": "system", "content": "S", "response_format": {"type": "json_object"}},
            {"role": "user", "content": "Q"}]
    assert encode_messages(msgs, "chat") == (
        f"{BOS}S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
        f'{{"type": "json_object"}}{U}Q{A}</think>')


# --- reasoning effort, context, reminders, tasks --------------------------------------------

def test_reasoning_effort_max_prefix_only_in_thinking_mode() -> None:
    q = [{"role": "user", "content": "Q"}]
    assert encode_messages(q, "thinking", reasoning_effort="max") == f"{BOS}{EFFORT_MAX}{U}Q{A}<think>"
    assert encode_messages(q, "thinking", reasoning_effort="high") == f"{BOS}{U}Q{A}<think>"
    assert encode_messages(q, "chat", reasoning_effort="max") == f"{BOS}{U}Q{A}</think>"


def test_context_suppresses_bos_and_continues_the_prompt() -> None:
    ctx = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}]
    nxt = [{"role": "user", "content": "Q2"}]
    tail = encode_messages(nxt, "chat", context=ctx)
    assert tail == f"{U}Q2{A}</think>"
    assert encode_messages(ctx, "chat") + tail == encode_messages(ctx + nxt, "chat")


def test_latest_reminder_and_developer() -> None:
    msgs = [{"role": "developer", "content": "Use metric."},
            {"role": "latest_reminder", "content": "Today is Monday."}]
    assert encode_messages(msgs, "chat") == (
        f"{BOS}{U}Use metric.{A}</think><｜latest_reminder｜>Today is Monday.")


def test_task_tokens() -> None:
    query = [{"role": "user", "content": "Q", "task": "query"}]
    assert encode_messages(query, "chat") == f"{BOS}{U}Q<｜query｜>"
    action = [{"role": "user", "content": "Q", "task": "action"}]
    assert encode_messages(action, "thinking") == f"{BOS}{U}Q{A}<think><｜action｜>"
    assert encode_messages(action, "chat") == f"{BOS}{U}Q{A}</think><｜action｜>"


# --- validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, fragment", [
    ({"thinking_mode": "reasoning"}, "thinking_mode: expected one of ['chat', 'thinking'], found 'reasoning'"),
    ({"thinking_mode": "thinking", "reasoning_effort": "low"}, "reasoning_effort: expected one of"),
])
def test_bad_mode_or_effort_is_a_value_error_naming_both(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        encode_messages([{"role": "user", "content": "Q"}], **kwargs)


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(EncodingError, match=r"messages\[1\] role: expected one of .*found 'narrator'"):
        encode_messages([{"role": "user", "content": "Q"}, {"role": "narrator", "content": "x"}], "chat")


def test_bad_task_and_empty_developer_are_rejected() -> None:
    with pytest.raises(EncodingError, match="task: expected one of"):
        encode_messages([{"role": "user", "content": "Q", "task": "summarize"}], "chat")
    with pytest.raises(EncodingError, match="non-empty content"):
        encode_messages([{"role": "developer", "content": ""}], "chat")


# --- parsing completions --------------------------------------------------------------------

def test_parse_round_trips_an_encoded_tool_call_turn() -> None:
    msgs = [{"role": "user", "content": "Q"},
            {"role": "assistant", "reasoning_content": "think", "content": "Let me check.",
             "tool_calls": [_call("c", "get_time", '{"tz": "UTC", "opts": {"h24": true}}')]}]
    prompt = encode_messages(msgs, "thinking")
    completion = prompt[prompt.index("<think>") + len("<think>"):]
    parsed = parse_message_from_completion_text(completion, "thinking")
    assert parsed["reasoning_content"] == "think" and parsed["content"] == "Let me check."
    (call,) = parsed["tool_calls"]
    assert call["function"]["name"] == "get_time"
    assert json.loads(call["function"]["arguments"]) == {"tz": "UTC", "opts": {"h24": True}}


def test_parse_plain_chat_completion() -> None:
    parsed = parse_message_from_completion_text(f"Four.{EOS}", "chat")
    assert parsed == {"role": "assistant", "content": "Four.", "reasoning_content": "", "tool_calls": []}


@pytest.mark.parametrize("text, mode", [
    ("Four.", "chat"),                            # no EOS
    (f"no close{EOS}", "thinking"),               # no </think>
    (f"a</think>b<think>c{EOS}", "thinking"),     # special string in content
    (f"Four.{EOS}trailing", "chat"),
])
def test_parse_rejects_malformed_completions(text: str, mode: str) -> None:
    with pytest.raises(EncodingError):
        parse_message_from_completion_text(text, mode)
