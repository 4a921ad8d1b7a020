"""``deepinfer chat`` options for DeepSeek-V4.1's thinking modes and reasoning effort."""

from __future__ import annotations

from deepinfer_core.cli.main import build_parser, main


def test_reasoning_effort_is_an_integer_or_an_alias():
    ns = build_parser().parse_args(["chat", "--thinking-mode", "think", "--reasoning-effort", "30"])
    assert (ns.thinking_mode, ns.reasoning_effort) == ("think", 30)
    assert build_parser().parse_args(["chat", "--reasoning-effort", "max"]).reasoning_effort == "max"
    assert build_parser().parse_args(["chat"]).reasoning_effort is None


def test_a_v4_checkpoint_refuses_a_reasoning_effort_in_one_line(capsys):
    code = main(
        ["chat", "--model", "demo-v4", "--message", "hi", "--reasoning-effort", "30", "--max-tokens", "1"]
    )
    assert code == 2
    assert "reasoning_effort is not part of the deepseek_v4 encoding" in capsys.readouterr().err
