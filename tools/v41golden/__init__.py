"""Writers of the DeepSeek-V4.1 oracle data under ``tests/data/v41`` (run through ``tools/v41_goldens.py``).

Our own code. DeepSeek's reference (``inference/model.py`` + ``engram.py`` with the CPU kernel stand-in) is
imported at run time from the package folder given on the command line; nothing of it lives here.
"""
