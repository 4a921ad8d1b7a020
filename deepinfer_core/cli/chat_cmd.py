"""``deepinfer chat``: a multi-turn conversation on the terminal (or one turn with --message)."""

from __future__ import annotations

import argparse
import json
import sys

from deepinfer_core.cli.args import sampling_kwargs
from deepinfer_core.cli.generate_cmd import make_llm


def run(ns: argparse.Namespace) -> int:
    from deepinfer_core import SamplingParams

    llm = make_llm(ns)
    params = SamplingParams(**sampling_kwargs(ns))
    messages: list[dict] = [{"role": "system", "content": ns.system}] if ns.system else []
    turns = list(ns.message) if ns.message else None
    while True:
        if turns is not None:
            if not turns:
                return 0
            user = turns.pop(0)
        else:
            try:
                user = input("user> ")
            except EOFError:
                print(file=sys.stderr)
                return 0
            if user.strip() in ("/exit", "/quit"):
                return 0
        messages.append({"role": "user", "content": user})
        out = llm.chat(
            messages,
            params,
            thinking_mode=ns.thinking_mode,
            reasoning_effort=ns.reasoning_effort,
            use_tqdm=False,
        )[0].outputs[0]
        messages.append({"role": "assistant", "content": out.text})
        print(json.dumps({"role": "assistant", "content": out.text}) if ns.json else f"assistant> {out.text}")
