"""The literal strings of DeepSeek-V4's chat encoding.

Every marker below is one added token in the V4 tokenizer (``tokenizer.json``), so a rendered
prompt must spell them exactly: ``<｜User｜>`` uses the full-width bar U+FF5C, and ``｜DSML｜`` is a
token *without* angle brackets, so ``<｜DSML｜invoke`` tokenizes as ``<`` + ``｜DSML｜`` + ``invoke``.
``<tool_result>`` is plain text, not a special token.

The two long prompts (reasoning effort, tools section) are the texts the model was trained on; they
are reproduced word for word from DeepSeek's published encoding (see ``deepinfer_core.chat``).
"""

from __future__ import annotations

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"

TOOL_RESULT_START = "<tool_result>"
TOOL_RESULT_END = "</tool_result>"

TOOL_CALLS_START = f"<{DSML}tool_calls>"
TOOL_CALLS_END = f"</{DSML}tool_calls>"
INVOKE_END = f"</{DSML}invoke>"
PARAMETER_END = f"</{DSML}parameter>"

# Markers that never appear inside a parsed ``content`` or ``reasoning_content``.
RESERVED_MARKERS = (BOS, EOS, THINK_START, THINK_END, DSML)

# Placed right after BOS in think-max mode; think-high adds nothing.
REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

# Appended (after a blank line) to the leading system prompt when tools are offered.
# ``{schemas}`` is one compact JSON object per tool, one per line.
TOOLS_SECTION = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    f'writing a "{TOOL_CALLS_START}" block like the following:\n\n'
    f"{TOOL_CALLS_START}\n"
    f'<{DSML}invoke name="$TOOL_NAME">\n'
    f'<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{PARAMETER_END}\n'
    "...\n"
    f"{INVOKE_END}\n"
    f'<{DSML}invoke name="$TOOL_NAME2">\n'
    "...\n"
    f"{INVOKE_END}\n"
    f"{TOOL_CALLS_END}\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types '
    '(numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    f"If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete reasoning "
    f"inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.\n\n"
    f"Otherwise, output directly after {THINK_END} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)
