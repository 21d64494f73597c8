"""The HF -> megatron load fills every parameter or fails the build naming the ones it cannot
(rlinf.models.megatron.bridge.load_hf_weights_strictly), in megatron-core on the CPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import build_actor  # noqa: E402


def without_mapping(megatron_param: str):
    """DeepSeekV3Bridge.mapping_registry with the mapping of `megatron_param` left out."""
    from megatron.bridge.models.conversion.mapping_registry import MegatronMappingRegistry
    from megatron.bridge.models.deepseek.common import get_common_mapping_list

    def registry(self):
        mappings = get_common_mapping_list(hf_config=self.hf_config)
        kept = [m for m in mappings if m.megatron_param != megatron_param]
        assert len(kept) == len(mappings) - 1
        return MegatronMappingRegistry(*kept)

    return registry


def test_a_parameter_without_a_mapping_fails_the_build_naming_it(on_cpu, tiny_megatron_checkpoint):
    from megatron.bridge.models.deepseek.deepseek_v3_bridge import DeepSeekV3Bridge

    from rlinf.models.megatron.bridge import UnfilledParameterError

    dropped = "decoder.layers.*.self_attention.linear_proj.weight"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DeepSeekV3Bridge, "mapping_registry", without_mapping(dropped))
        with pytest.raises(UnfilledParameterError) as err:
            build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    message = str(err.value)
    for layer in range(3):
        assert f"decoder.layers.{layer}.self_attention.linear_proj.weight" in message
    assert "3 megatron parameter(s)" in message


def test_a_checkpoint_missing_a_tensor_fails_the_build_naming_the_parameter(
    on_cpu, tiny_megatron_checkpoint, tmp_path
):
    from safetensors.torch import load_file, save_file

    from rlinf.models.megatron.bridge import UnfilledParameterError

    for path in tiny_megatron_checkpoint.iterdir():
        if path.suffix == ".safetensors":
            tensors = load_file(path)
            tensors.pop("model.layers.1.self_attn.kv_b_proj.weight", None)
            save_file(tensors, tmp_path / path.name, metadata={"format": "pt"})
        elif path.is_file():
            (tmp_path / path.name).write_bytes(path.read_bytes())
    with pytest.raises(
        UnfilledParameterError, match=r"decoder\.layers\.1\.self_attention\.linear_kv_up_proj\.weight"
    ):
        build_actor(tmp_path, "fp32", precision="fp32")


def test_the_complete_checkpoint_loads_every_parameter(on_cpu, tiny_megatron_checkpoint):
    """Control: the same build with nothing removed loads, and the weights are the checkpoint's."""
    from safetensors.torch import load_file

    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    stored = {}
    for path in tiny_megatron_checkpoint.glob("*.safetensors"):
        stored.update(load_file(path))
    exported = dict(actor.bridge.export_hf_weights(actor.model, cpu=True, show_progress=False))
    assert set(exported) == set(stored)
    assert all(torch.equal(exported[n], stored[n]) for n in stored)
