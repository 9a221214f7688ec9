"""Where the repository is, for tests that read its files (README, docs, profiles, scripts)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
