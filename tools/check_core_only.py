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

# the server is an optional extra: without it, `deepinfer serve` says how to get it
serve = subprocess.run(["deepinfer", "serve", "--port", "0"], capture_output=True, text=True, timeout=120)
if serve.returncode == 0 or 'pip install "deepinfer-core[serve]"' not in serve.stderr:
    sys.exit(
        f"expected `deepinfer serve` to ask for the serve extra, got rc={serve.returncode}: {serve.stderr}"
    )
print('core-only install: `deepinfer serve` asks for pip install "deepinfer-core[serve]"')
