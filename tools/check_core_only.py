"""Assert that only the built-in reference platform is installed (run in a core-only venv)."""

import json
import subprocess
import sys

info = json.loads(subprocess.check_output(["deepinfer", "plugins", "--json"], text=True))
platforms = {name for p in info["plugins"] for name in p["platforms"]}
if platforms != {"reference"} or info["auto"] != "reference" or info["failed"]:
    sys.exit(
        f"expected only the reference platform, got {sorted(platforms)} (auto={info['auto']}, failed={info['failed']})"
    )
print("core-only install: platforms = ['reference'], auto -> reference")
