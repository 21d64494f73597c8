"""Tuned fused-MoE kernel tables for SGLang, for expert shapes SGLang ships none for.

SGLang's triton MoE kernel reads one JSON table per (local experts E, expert width N, GPU name,
triton version): batch size -> tile config. It has none for Moonlight's experts (N=1408), so it runs
one generic config at every batch size. `benchmarks/tune_sglang_moe.py` measures and writes our
tables into `configs/triton_<version>/` here, in SGLang's own layout; `engine_env` points an engine
at this folder (SGLANG_MOE_CONFIG_DIR) only when it holds the table for that engine's shape, since
the variable replaces SGLang's own folder for every shape.

Pure Python (no sglang, no CUDA), tested on the CPU.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV_VAR = "SGLANG_MOE_CONFIG_DIR"


def config_file_name(experts: int, width: int, device_name: str) -> str:
    """SGLang 0.5.12's name for an unquantised table (fused_moe_triton_config.get_config_file_name)."""
    return f"E={experts},N={width},device_name={device_name.replace(' ', '_')}.json"


def local_expert_shape(hf_config: dict, tp_size: int, ep_size: int) -> tuple[int, int] | None:
    """(experts per GPU, expert width per GPU) of SGLang's routed-expert weights for a DeepSeek-V3
    checkpoint's config.json; None for a dense model. SGLang splits the experts over ep_size ranks
    and each expert's width over the remaining tp_size // ep_size."""
    experts = hf_config.get("n_routed_experts")
    width = hf_config.get("moe_intermediate_size")
    if not experts or not width:
        return None
    return experts // ep_size, width // max(1, tp_size // ep_size)


def tuned_tables(experts: int, width: int, root: Path = HERE) -> list[Path]:
    """Our tables for this shape, any GPU and triton version (SGLang picks the running GPU's, in
    the running triton version's folder or else the newest other one)."""
    return sorted((root / "configs").glob(f"triton_*/{config_file_name(experts, width, '*')}"))


def engine_env(hf_config: dict, tp_size: int, ep_size: int, root: Path = HERE) -> dict[str, str]:
    """Environment for an SGLang engine of this shape: our table folder when it holds a table for
    the shape. The GPU is not checked here (that would start CUDA in the rollout worker): on a GPU
    we have no table for, SGLang uses its generic config, as it would anyway, since it ships no
    table for these shapes (tests/gpu/test_sglang_signatures.py checks that against the installed
    sglang, which the CPU machine cannot import)."""
    shape = local_expert_shape(hf_config, tp_size, ep_size)
    if shape is None or not tuned_tables(*shape, root):
        return {}
    return {ENV_VAR: str(root)}
