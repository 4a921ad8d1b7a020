"""The ``deepinfer`` command line: plugins, generate, chat, bench."""
