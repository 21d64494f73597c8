"""benchmarks/tune_sglang_moe.py's search space: the distinct configs of SGLang's own bf16 tables for
this GPU at the nearest expert width, else every Hopper bf16 table of that expert count."""

import json
from pathlib import Path

from benchmarks.tune_sglang_moe import candidate_configs, write_table_from
from rlinf.workers.rollout import moe_configs


def cfg(m: int, n: int = 64) -> dict:
    return {
        "BLOCK_SIZE_M": m,
        "BLOCK_SIZE_N": n,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }


def write(root, version: str, name: str, rows: dict) -> None:
    path = root / f"triton_{version}" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))


def test_nearest_width_on_this_gpu_without_quantised_tables(tmp_path):
    write(tmp_path, "3_5_1", "E=64,N=1280,device_name=NVIDIA_H200.json", {"1": cfg(16), "64": cfg(32)})
    write(tmp_path, "3_6_0", "E=64,N=1280,device_name=NVIDIA_H200.json", {"1": cfg(16)})  # duplicate
    write(tmp_path, "3_6_0", "E=64,N=2560,device_name=NVIDIA_H200.json", {"1": cfg(128)})
    write(tmp_path, "3_6_0", "E=64,N=1280,device_name=NVIDIA_H200,dtype=fp8_w8a8.json", {"1": cfg(64)})
    write(tmp_path, "3_6_0", "E=64,N=1280,device_name=NVIDIA_H100_80GB_HBM3.json", {"1": cfg(16, 128)})
    write(tmp_path, "3_6_0", "E=8,N=1408,device_name=NVIDIA_H200.json", {"1": cfg(256)})

    found = candidate_configs(tmp_path, 64, 1408, "NVIDIA H200")
    assert sorted(c["BLOCK_SIZE_M"] for c in found) == [16, 32]  # N=1280 is nearer 1408 than 2560

    # A GPU without tables of its own: every Hopper bf16 table for 64 experts, deduplicated.
    other = candidate_configs(tmp_path, 64, 1408, "NVIDIA H20")
    assert sorted((c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"]) for c in other) == [
        (16, 64),
        (16, 128),
        (32, 64),
        (128, 64),
    ]
    assert candidate_configs(tmp_path, 16, 1408, "NVIDIA H200") == []


def test_shipped_tables_are_the_recorded_tuning_results(tmp_path):
    """The tables we ship are exactly the winners of the H200 runs recorded in docs/data."""
    repo = Path(__file__).parents[2]
    for result in sorted((repo / "docs" / "data").glob("sglang_moe_tune_E*_2026-12-02.json")):
        written = write_table_from(result, tmp_path)
        shipped = moe_configs.HERE / "configs" / written.relative_to(tmp_path)
        assert written.read_text() == shipped.read_text(), shipped.name
    assert len(list(tmp_path.glob("triton_*/*.json"))) == 2
