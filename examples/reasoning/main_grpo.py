"""GRPO on math reasoning: `python examples/reasoning/main_grpo.py [recipe] [key=value ...]`.

Exit codes: rlinf/config/exit_codes.py (and docs/configuration.md, "Exit codes")."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlinf.utils.signals import stop_on_sigterm, stopped_by  # noqa: E402

stop_on_sigterm()  # before the heavy imports below: a SIGTERM while they load unwinds too

if __name__ == "__main__":
    try:
        from rlinf.runners.main import main

        sys.exit(main())
    except KeyboardInterrupt as err:  # a second Ctrl-C, or SIGTERM before main() took over
        stop = stopped_by(err)
        print(f"{stop} during start-up" if stop else "interrupted", file=sys.stderr)
        sys.exit(128 + stop.signum if stop else 130)
