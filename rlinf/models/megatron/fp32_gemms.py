"""Exact fp32 GEMMs under Transformer Engine.

TE asks cuBLASLt for TF32 on every fp32 GEMM (its compute type is fixed in the library), so an fp32
actor on the TE spec multiplies with 10-bit mantissa inputs: 1.5e-3 off exact on a 2048-wide
linear, logprobs 0.26 off HF fp32 on the Moonlight slice (H200). NVIDIA's libraries give
NVIDIA_TF32_OVERRIDE=0 precedence over any programmatic request, but read it when they start in a
process, so it has to be in the environment the process starts with (set later, it changes
nothing). The runner starts an fp32 actor's workers with it (rlinf.scheduler.roles); a process
that builds the actor itself has to be started with it.
"""

from __future__ import annotations

import os

OVERRIDE_ENV = "NVIDIA_TF32_OVERRIDE"
TF32_WARNING = (
    "actor.model.precision fp32 with Transformer Engine: this process was started without "
    f"{OVERRIDE_ENV}=0, so TE's fp32 GEMMs run on TF32 tensor cores (about 1e-3 relative error); "
    "the runner sets it for its actor workers, start a process that builds the actor itself with it"
)


def exact_fp32_env(precision: str) -> dict[str, str]:
    """The variables an actor process of this precision starts with (none below fp32)."""
    return {OVERRIDE_ENV: "0"} if precision == "fp32" else {}


def fp32_gemm_mode(te_available: bool) -> str:
    """How this process runs fp32 GEMMs: "exact", or "tf32" (TE without the override)."""
    if te_available and os.environ.get(OVERRIDE_ENV) != "0":
        return "tf32"
    return "exact"
