"""Let megatron-bridge 0.6.2 import on a machine without Transformer Engine (TE).

megatron-bridge imports `transformer_engine.pytorch` at module level (peft/lora_layers.py, reached
from `import megatron.bridge`), although the conversion code the actor uses never touches TE. TE's
torch extension has no prebuilt wheel for torch 2.11, so on such machines this module registers a
placeholder package under the name `transformer_engine`:

- every submodule (`transformer_engine.pytorch.*`) is a placeholder module;
- every public attribute is a placeholder class that can be subclassed or referenced in an
  isinstance check, and raises `TransformerEngineMissing` when instantiated or called.

Order matters: each megatron-core module decides HAVE_TE when it is first imported, so the modules
the actor runs (`MEGATRON_CORE_MODULES`) are imported BEFORE the placeholder exists and keep their
TE-free code paths; `install()` does that. Modules first imported later (megatron.training, the
hybrid specs that megatron-bridge pulls in) see the placeholder, whose version is 0.0.0, so
version-gated TE features stay off; they only build spec tables at import time. Nothing is
installed when the real TE is importable.

`RLINF_MEGATRON_TE=off` makes a machine that has TE behave as one without it (the TE-free spec, for
comparisons in one environment): while the megatron-core modules above are imported, the real TE
cannot be, then the placeholder takes its name. It must be set before megatron is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

PACKAGE = "transformer_engine"
MARKER = "__rlinf_te_placeholder__"
PLACEHOLDER_VERSION = "0.0.0"
SWITCH_ENV = "RLINF_MEGATRON_TE"  # "auto" (default: TE when importable) or "off"

# megatron-core modules on the actor's path: imported before the placeholder so they see no TE.
MEGATRON_CORE_MODULES = (
    "megatron.core",
    "megatron.core.fp8_utils",
    "megatron.core.extensions.transformer_engine",
    "megatron.core.tensor_parallel",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.transformer.multi_latent_attention",
    "megatron.core.transformer.moe.moe_layer",
    "megatron.core.transformer.moe.experts",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.distributed",
    "megatron.core.optimizer",
    "megatron.core.pipeline_parallel",
    "megatron.core.dist_checkpointing",
)


class TransformerEngineMissing(RuntimeError):
    """Code tried to use a Transformer Engine class on a machine that has no TE."""


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder_class(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise TransformerEngineMissing(
            f"{cls.__qualname__} is a placeholder: Transformer Engine is not installed "
            "(rlinf.models.megatron.te_placeholder); use the TE-free spec"
        )


def _placeholder_class(qualname: str) -> type:
    return _PlaceholderMeta(
        qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": PACKAGE}
    )


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == PACKAGE or fullname.startswith(PACKAGE + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []  # a package, so that submodule imports reach this finder
        setattr(module, MARKER, True)
        module.__version__ = PLACEHOLDER_VERSION
        return module

    def exec_module(self, module):
        pass


class _Blocker(importlib.abc.MetaPathFinder):
    """Makes `import transformer_engine` fail, as on a machine without TE."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == PACKAGE or fullname.startswith(PACKAGE + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r} ({SWITCH_ENV}=off)", name=fullname)
        return None


def te_switched_off() -> bool:
    """True when RLINF_MEGATRON_TE=off asks for the TE-free path although TE may be installed."""
    value = os.environ.get(SWITCH_ENV, "auto").strip().lower()
    if value not in ("auto", "off"):
        raise ValueError(f"{SWITCH_ENV}={value!r}: expected auto or off")
    return value == "off"


def _real_te_imported() -> bool:
    module = sys.modules.get(PACKAGE)
    return module is not None and not getattr(module, MARKER, False)


def real_te_available() -> bool:
    """True when the genuine Transformer Engine torch extension can be imported (and is not
    switched off with RLINF_MEGATRON_TE=off)."""
    if te_switched_off():
        return False
    module = sys.modules.get(PACKAGE)
    if module is not None:
        return not getattr(module, MARKER, False)
    try:
        return importlib.util.find_spec(f"{PACKAGE}.pytorch") is not None
    except (ImportError, ValueError):
        return False


def is_installed() -> bool:
    return getattr(sys.modules.get(PACKAGE), MARKER, False)


def install() -> bool:
    """Register the placeholder unless real TE exists; returns True when the placeholder is active."""
    if real_te_available():
        return False
    if is_installed():
        return True
    if _real_te_imported():
        # Something else imported TE first (transformers' integrations may); megatron decides
        # HAVE_TE on import, so TE can still be hidden from it unless megatron-core came first.
        if "megatron.core" in sys.modules:
            raise RuntimeError(
                f"{SWITCH_ENV}=off: megatron-core was imported with Transformer Engine already; "
                "set it before megatron is imported"
            )
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]
    blocker = _Blocker()
    sys.meta_path.insert(0, blocker)
    try:
        for name in MEGATRON_CORE_MODULES:
            importlib.import_module(name)
    finally:
        sys.meta_path.remove(blocker)
    sys.meta_path.insert(0, _Finder())
    importlib.import_module(PACKAGE)
    return True
