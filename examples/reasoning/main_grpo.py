"""GRPO on math reasoning: `python examples/reasoning/main_grpo.py [recipe] [key=value ...]`.

Exit codes: rlinf/config/exit_codes.py (and docs/configuration.md, "Exit codes")."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlinf.runners.main import main  # noqa: E402

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # a second Ctrl-C: workers and Ray were shut down on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
