"""The tuned SGLang MoE tables we ship, and when an engine is pointed at them."""

import json
from pathlib import Path

from rlinf.workers.rollout import moe_configs

MOONLIGHT = json.loads((Path(__file__).parents[1] / "fixtures" / "moonlight-16b-a3b-config.json").read_text())
KEYS = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}


def test_file_name_is_sglangs():
    # sglang 0.5.12 fused_moe_triton_config.get_config_file_name(64, 1408, None) on an H200
    assert moe_configs.config_file_name(64, 1408, "NVIDIA H200") == "E=64,N=1408,device_name=NVIDIA_H200.json"


def test_local_expert_shape_follows_the_parallel_layout():
    assert moe_configs.local_expert_shape(MOONLIGHT, tp_size=1, ep_size=1) == (64, 1408)
    assert moe_configs.local_expert_shape(MOONLIGHT, tp_size=8, ep_size=8) == (8, 1408)  # the recipe
    assert moe_configs.local_expert_shape(MOONLIGHT, tp_size=8, ep_size=1) == (64, 176)  # TP-split experts
    assert moe_configs.local_expert_shape({"hidden_size": 64}, tp_size=1, ep_size=1) is None  # dense


def test_engine_env_points_at_our_tables_only_for_shapes_we_have(tmp_path):
    # Moonlight's recipe layout and the one-GPU slice have tables; the TP-split width has none, and
    # then SGLang must keep looking in its own folder (no variable set).
    for tp, ep in ((8, 8), (1, 1)):
        assert moe_configs.engine_env(MOONLIGHT, tp, ep) == {"SGLANG_MOE_CONFIG_DIR": str(moe_configs.HERE)}
    assert moe_configs.engine_env(MOONLIGHT, 8, 1) == {}
    assert moe_configs.engine_env(MOONLIGHT, 8, 8, root=tmp_path) == {}
    table = tmp_path / "configs" / "triton_9_9_9" / moe_configs.config_file_name(8, 1408, "Some GPU")
    table.parent.mkdir(parents=True)
    table.write_text("{}")
    assert moe_configs.engine_env(MOONLIGHT, 8, 8, root=tmp_path) == {"SGLANG_MOE_CONFIG_DIR": str(tmp_path)}


def test_shipped_tables_are_complete_kernel_configs():
    tables = sorted((moe_configs.HERE / "configs").glob("triton_*/*.json"))
    assert {t.name for t in tables} >= {
        "E=64,N=1408,device_name=NVIDIA_H200.json",
        "E=8,N=1408,device_name=NVIDIA_H200.json",
    }
    for table in tables:
        rows = json.loads(table.read_text())
        batches = sorted(int(m) for m in rows)
        assert batches[0] == 1 and batches[-1] >= 256, table.name  # decode sizes and prefill chunks
        for config in rows.values():
            assert set(config) == KEYS, table.name
            for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
                assert config[key] & (config[key] - 1) == 0, (table.name, config)  # triton tiles: powers of 2
