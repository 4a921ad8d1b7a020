"""``deepinfer serve`` as a user starts it: a subprocess, settings from flags, environment and file."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading

import httpx
import openai
import pytest

from deepinfer_core.config import ConfigError
from deepinfer_core.serve.settings import load_serve_config

STARTUP_TIMEOUT = 180


def _watch(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def test_deepinfer_serve_starts_on_loopback_with_the_key_from_the_environment(tmp_path):
    cfg = tmp_path / "serve.toml"
    cfg.write_text('max_model_len = 512\nserved_model_name = "demo"\nmax_tokens_limit = 64\n')
    env = {**os.environ, "DEEPINFER_API_KEY": "from-env", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "deepinfer_core.cli.main", "serve", "--port", "0", "--config", str(cfg)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_watch, args=(proc.stderr, lines), daemon=True).start()
    try:
        url = None
        while url is None:
            line = lines.get(timeout=STARTUP_TIMEOUT)
            assert line is not None, "deepinfer serve exited before it was serving"
            m = re.search(r"serving 'demo' \(backend \w+\) at (http://127\.0\.0\.1:\d+/v1)", line)
            url = m.group(1) if m else None
        assert httpx.get(url.removesuffix("/v1") + "/health", timeout=60).status_code == 200
        assert httpx.get(url + "/models", timeout=60).status_code == 401
        client = openai.OpenAI(base_url=url, api_key="from-env")
        assert [m.id for m in client.models.list().data] == ["demo"]
        r = client.completions.create(model="demo", prompt="def f(x):", max_tokens=5, temperature=0)
        assert r.usage.completion_tokens == 5
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            client.completions.create(model="demo", prompt="def f(x):", max_tokens=65)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0  # Ctrl-C: a graceful shutdown


def test_serve_settings_take_file_then_environment_then_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 9000\nmax_n: 3\nmax_num_seqs: 8\nhost: 0.0.0.0\n")
    env = {
        "DEEPINFER_PORT": "9001",
        "DEEPINFER_MAX_NUM_SEQS": "9",
        "DEEPINFER_CORS_ALLOW_ORIGINS": "a.example, b.example",
    }
    engine, s = load_serve_config(cfg, {"max_num_seqs": 10}, {"port": 9002}, environ=env)
    assert (s.port, engine.max_n, s.host, engine.max_num_seqs) == (9002, 3, "0.0.0.0", 10)
    assert s.cors_allow_origins == ["a.example", "b.example"]
    engine, s = load_serve_config(cfg, {}, {}, environ=env)
    assert (s.port, engine.max_num_seqs) == (9001, 9)


def test_an_unknown_or_invalid_setting_is_an_error_that_names_it(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"prot": 1}')
    with pytest.raises(ConfigError, match="prot"):
        load_serve_config(cfg, environ={})
    with pytest.raises(ConfigError, match="port"):
        load_serve_config(None, {}, {"port": 70000}, environ={})
