"""Import check of the agentic stack: one line per package, exit 1 if any import fails.

Run inside the venv: `python requirements/agentic/check_stack.py`. A machine without a GPU passes
with a warning (torch.cuda is reported, not required), so the stack can be installed on a build node.
"""

from __future__ import annotations

import importlib
import sys


def _version(module_name: str) -> str:
    module = importlib.import_module(module_name)
    return str(getattr(module, "__version__", "?"))


def _import_bridge() -> str:
    # megatron-bridge 0.6.2 imports transformer_engine at module level; without a real TE build
    # rlinf's placeholder stands in (the actor then uses its TE-free spec).
    try:
        from rlinf.models.megatron import te_placeholder
    except ImportError:
        te_placeholder = None
    note = ""
    if te_placeholder is not None and te_placeholder.install():
        note = " (Transformer Engine not installed: rlinf's placeholder stands in)"
    try:
        return _version("megatron.bridge") + note
    except ImportError as exc:
        if "from 'transformers'" not in str(exc):
            raise
        # megatron-bridge 0.6.2 imports transformers.models.exaone4_5, new in transformers 5.8.
        raise ImportError(
            f"{exc}; megatron-bridge 0.6.2 needs transformers >= 5.8 (installed {_version('transformers')}): "
            "re-run install.sh agentic with --transformers 5.12.1 (docs/install.md)"
        ) from None


def main() -> int:
    failed = []
    checks = [
        ("torch", lambda: _version("torch")),
        ("sglang", lambda: _version("sglang")),
        ("megatron.core", lambda: _version("megatron.core")),
        ("megatron.bridge", _import_bridge),
        ("ray", lambda: _version("ray")),
    ]
    for name, check in checks:
        try:
            print(f"ok    {name} {check()}")
        except Exception as exc:  # report every failing import, not just the first
            failed.append(name)
            print(f"FAIL  {name}: {type(exc).__name__}: {exc}")
    try:
        import torch

        cuda = torch.version.cuda
        if torch.cuda.is_available():
            print(
                f"ok    torch.cuda: CUDA {cuda}, {torch.cuda.device_count()} GPU(s), {torch.cuda.get_device_name(0)}"
            )
        else:
            print(f"warn  torch.cuda: built for CUDA {cuda} but no GPU is visible here")
    except ImportError:
        pass
    if failed:
        print(f"import check failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
