"""The literal strings of DeepSeek's chat encodings (V4 and V4.1).

Every marker below is one added token in the V4 tokenizer (``tokenizer.json``), so a rendered
prompt must spell them exactly: ``<｜User｜>`` uses the full-width bar U+FF5C, and ``｜DSML｜`` is a
token *without* angle brackets, so ``<｜DSML｜invoke`` tokenizes as ``<`` + ``｜DSML｜`` + ``invoke``.
``<tool_result>`` is plain text, not a special token. V4.1 adds ``<｜System｜>`` and the image
placeholder ``<｜deepseek_image｜>`` (tokens of V4.1's tokenizer, which this package does not ship).

The long prompts (reasoning effort, tools section) are the texts the models were trained on; they
are reproduced word for word from DeepSeek's published encodings (see ``deepinfer_core.chat``).
"""

from __future__ import annotations

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"
SYSTEM = "<｜System｜>"  # V4.1: opens the leading system block and every later system message
IMAGE_PLACEHOLDER = "<｜deepseek_image｜>"  # V4.1: stands for an image; never allowed inside text

TOOL_RESULT_START = "<tool_result>"
TOOL_RESULT_END = "</tool_result>"

# V4's DSML tags (V4.1 puts a space before each tag name: see ``dsml.V41_TAGS``).
TOOL_CALLS_START = f"<{DSML}tool_calls>"
TOOL_CALLS_END = f"</{DSML}tool_calls>"
INVOKE_END = f"</{DSML}invoke>"
PARAMETER_END = f"</{DSML}parameter>"

# Markers that never appear inside a parsed ``content`` or ``reasoning_content``.
RESERVED_MARKERS = (BOS, EOS, THINK_START, THINK_END, DSML)

# V4: placed right after BOS in think-max mode; think-high adds nothing.
REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

# V4.1: the numeric effort line, right after the leading ``<｜System｜>`` in thinking mode.
REASONING_EFFORT_BUDGET = (
    "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
)

# Appended (after a blank line) to the leading system prompt when tools are offered. The tag fields
# are filled from the encoding's DSML tags; ``{{schemas}}`` becomes one compact JSON object per tool,
# one per line. V4 and V4.1 differ only in the tags.
TOOLS_SECTION = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    'writing a "{calls_start}" block like the following:\n\n'
    "{calls_start}\n"
    '{invoke_open}$TOOL_NAME">\n'
    '{parameter_open}$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{parameter_end}\n'
    "...\n"
    "{invoke_end}\n"
    '{invoke_open}$TOOL_NAME2">\n'
    "...\n"
    "{invoke_end}\n"
    "{calls_end}\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types '
    '(numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    f"If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete reasoning "
    f"inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.\n\n"
    f"Otherwise, output directly after {THINK_END} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{{schemas}}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)
