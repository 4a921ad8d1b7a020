"""``tests/conftest.py`` starts the slowest test files first; its list must name files that exist."""

from pathlib import Path

from tests.conftest import SLOW_FILES_FIRST

ROOT = Path(__file__).resolve().parent.parent


def test_every_file_named_first_exists():
    missing = [f for f in SLOW_FILES_FIRST if not (ROOT / f).is_file()]
    assert not missing, f"renamed or removed test files in tests/conftest.py's SLOW_FILES_FIRST: {missing}"
    assert len(set(SLOW_FILES_FIRST)) == len(SLOW_FILES_FIRST)
