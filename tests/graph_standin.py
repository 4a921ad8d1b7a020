"""A CPU stand-in for CUDA graph capture, shared by the tests of static (graph-shaped) steps.

``stand_in_capture(runner, monkeypatch)`` replaces the platform's ``capture_graph`` with one that runs the step
once (the CUDA path's warm-up) and returns a replay that runs it again, and counts ``captures``, ``replays`` and
``runs`` of the runner's graph cache. A static step then reaches the model only through the runner's copies into
its graph inputs, as on a GPU; a device capture only records, so every run (the capturing one too) must replay:
tests assert ``replays == runs``.
"""

from __future__ import annotations


def stand_in_capture(runner, monkeypatch) -> dict[str, int]:
    counts = {"captures": 0, "replays": 0, "runs": 0}

    def capture_graph(fn):
        fn()  # warm-up, like the CUDA path
        counts["captures"] += 1

        def replay():
            counts["replays"] += 1
            fn()

        return replay

    monkeypatch.setattr(runner.backends.memory, "capture_graph", capture_graph)
    real_run = runner.graphs.run

    def counted(*a, **kw):
        counts["runs"] += 1
        return real_run(*a, **kw)

    monkeypatch.setattr(runner.graphs, "run", counted)
    return counts
