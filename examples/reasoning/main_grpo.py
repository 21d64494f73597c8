"""GRPO on math reasoning: `python examples/reasoning/main_grpo.py [recipe] [key=value ...]`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlinf.runners.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
