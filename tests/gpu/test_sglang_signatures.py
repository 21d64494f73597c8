"""Every SGLang call rlinf makes, checked against the installed package: Engine methods take the
keyword arguments we pass, ServerArgs has every field engine_kwargs sets, the sampling keys exist,
and the classes our IPC payload pickles are where SGLang's SafeUnpickler allows them."""

import dataclasses
import inspect
from dataclasses import replace
from pathlib import Path

from rlinf.config.schema import Config, RoutingReplayConfig
from rlinf.workers.rollout import moe_configs
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.sglang_args import engine_kwargs, sampling_dicts
from rlinf.workers.rollout.sglang_engine import SGLANG_CALLS


def test_engine_methods_take_our_arguments(sglang_installed):
    from sglang.srt.entrypoints.engine import Engine

    for method, kwargs in SGLANG_CALLS.items():
        params = inspect.signature(getattr(Engine, method)).parameters
        missing = [k for k in kwargs if k not in params]
        assert not missing, f"sglang Engine.{method} lacks {missing}; has {list(params)}"


def test_weight_checksums_call_exists(sglang_installed):
    """SGLangEngine.weight_checksums asks the tokenizer manager's check_weights for checksums."""
    from sglang.srt.managers.io_struct import CheckWeightsReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.utils.weight_checker import WeightChecker

    assert list(inspect.signature(TokenizerManager.check_weights).parameters)[:3] == [
        "self",
        "obj",
        "request",
    ]
    assert CheckWeightsReqInput(action="checksum").action == "checksum"
    assert "_compute_checksum" in vars(WeightChecker)


def test_server_args_have_every_field_we_set(sglang_installed):
    from sglang.srt.server_args import ServerArgs

    fields = {f.name for f in dataclasses.fields(ServerArgs)}
    split = replace(Config().rollout.sglang, decode_attention_backend="flashmla")
    replay = replace(Config().algorithm, routing_replay=RoutingReplayConfig("replay"))
    cfg = replace(Config(), rollout=replace(Config().rollout, sglang=split), algorithm=replay)
    ours = set(engine_kwargs(cfg, model_path="/x", colocated=True)) | {"custom_sigquit_handler"}
    assert not ours - fields, f"ServerArgs lacks {sorted(ours - fields)}"
    assert "enable_ep_moe" not in fields  # why rollout.sglang.enable_ep_moe maps to ep_size


def test_sampling_keys_exist(sglang_installed):
    from sglang.srt.sampling.sampling_params import SamplingParams as SGLangSamplingParams

    params = inspect.signature(SGLangSamplingParams.__init__).parameters
    (ours,) = sampling_dicts(SamplingParams(min_new_tokens=1), [2], [7])
    assert not set(ours) - set(params), f"sglang SamplingParams lacks {sorted(set(ours) - set(params))}"
    SGLangSamplingParams(**ours).verify(vocab_size=100)


def test_ipc_payload_classes_are_unpicklable_by_sglang(sglang_installed):
    from sglang.srt.utils.common import SafeUnpickler
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

    module = FlattenedTensorMetadata.__module__ + "."
    assert any(module.startswith(p) for p in SafeUnpickler.ALLOWED_MODULE_PREFIXES)
    fields = {f.name for f in dataclasses.fields(FlattenedTensorMetadata)}
    assert fields == {"name", "shape", "dtype", "start_idx", "end_idx", "numel"}


def test_moe_tables_use_sglangs_names_and_fill_a_gap(sglang_installed, monkeypatch):
    """Our tuned tables are found only under SGLang's own file names, and pointing an engine at
    our folder hides nothing SGLang ships: it has no table for these shapes on any GPU."""
    from sglang.srt.layers.moe.moe_runner import triton_utils
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as lookup

    shipped = Path(triton_utils.__file__).parent / "configs"
    for table in sorted((moe_configs.HERE / "configs").glob("triton_*/*.json")):
        experts, width = (int(part.split("=")[1]) for part in table.name.split(",")[:2])
        gpu = table.name.split("device_name=")[1].removesuffix(".json")
        monkeypatch.setattr(lookup, "get_device_name", lambda gpu=gpu: gpu.replace("_", " "))
        assert lookup.get_config_file_name(experts, width, None) == table.name
        assert not list(shipped.glob(f"triton_*/E={experts},N={width},*")), table.name


def test_hook_target_and_plugin_api_exist(sglang_installed):
    """rlinf's plugin (sglang_hooks.py) wraps SGLang's unseeded sampler: the function must exist
    with the parameters the hook forwards and be called by name in its module (so the replaced
    global takes effect), plugins of our entry-point group must be loaded by the scheduler process,
    and the hook registry must take an AROUND hook. Read from the sources: no engine import."""
    import ast
    import importlib.util

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from rlinf.workers.rollout import sglang_hooks

    def source(module: str) -> str:
        return Path(importlib.util.find_spec(module).origin).read_text()

    module_path, function = sglang_hooks.TARGET.rsplit(".", 1)
    tree = ast.parse(source(module_path))
    (target,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    assert [a.arg for a in target.args.args] == ["probs", "sampling_seed", "positions"]
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert function in called
    assert f'GENERAL_PLUGINS_GROUP = "{sglang_hooks.PLUGIN_GROUP}"' in source("sglang.srt.plugins")
    assert "load_plugins()" in source("sglang.srt.managers.scheduler")
    assert callable(HookRegistry.register) and HookType.AROUND.value == "around"
