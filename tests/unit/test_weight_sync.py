"""Weight sync plans: strategy choice, flattened buckets, IPC/NCCL call order (recording fakes), and
the engine's release/resume bookkeeping (a recording fake sglang.Engine). The real engine is tested
on the GPU (tests/gpu/test_sglang_engine_gpu.py, test_sglang_megatron_sync.py)."""

import pytest
import torch
from weight_sync_fakes import FakeGroup

import rlinf.weight_sync as ws
from rlinf.models.weights import checkpoint_tensors
from rlinf.weight_sync.exporter import WeightExporter, dispatch
from rlinf.weight_sync.plan import (
    CUDA_IPC,
    NCCL,
    OBJECT_STORE,
    WEIGHT_GROUP_NAME,
    choose_strategy,
    nccl_group_plan,
    pack_buckets,
    unflatten_bucket,
)
from rlinf.workers.rollout.base import RolloutWorker

SGLANG_TAKES = (CUDA_IPC, NCCL, OBJECT_STORE)


def test_strategy_follows_the_placement():
    assert choose_strategy(SGLANG_TAKES, colocated=True) == CUDA_IPC
    assert choose_strategy(SGLANG_TAKES, colocated=False) == NCCL
    assert choose_strategy((OBJECT_STORE,), colocated=True) == OBJECT_STORE
    with pytest.raises(ValueError, match="none fits"):
        choose_strategy((CUDA_IPC,), colocated=False)


def test_packed_bucket_round_trips_mixed_dtypes():
    source = [
        ("a.weight", torch.randn(3, 5, dtype=torch.bfloat16)),  # 30 bytes: the next start is aligned up
        ("gate.e_score_correction_bias", torch.randn(5, dtype=torch.float32)),  # stays fp32
        ("b.weight", torch.randn(2, 3, 2).transpose(0, 2)),  # non-contiguous view
    ]
    ((flat, meta),) = pack_buckets(iter(source), 1024)
    assert flat.dtype == torch.uint8 and meta.nbytes == 30 + 5 * 4 + 12 * 4
    assert [t.start for t in meta.tensors] == [0, 32, 64] and flat.numel() == 64 + 48
    assert meta.names == ["a.weight", "gate.e_score_correction_bias", "b.weight"]
    assert meta.dtypes == ["bfloat16", "float32", "float32"]
    assert meta.shapes == [[3, 5], [5], [2, 3, 2]]
    for (name, original), (name2, restored) in zip(source, unflatten_bucket(flat, meta), strict=True):
        assert name == name2 and restored.dtype == original.dtype and torch.equal(restored, original)
    source[0][1].zero_()  # the packed copy does not follow later changes of the model
    assert not torch.equal(unflatten_bucket(flat, meta)[0][1], source[0][1])


def test_pack_buckets_closes_a_bucket_when_the_next_tensor_does_not_fit():
    sizes = [40, 40, 30, 100, 8]  # bytes; 100 is larger than a bucket and travels alone
    source = [(f"t{i}", torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate(sizes)]
    buckets = [meta.names for _, meta in pack_buckets(iter(source), 64)]
    assert buckets == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"]]  # 40 + (aligned 48) + 40 > 64
    buckets = [meta.names for _, meta in pack_buckets(iter(source), 96)]
    assert buckets == [["t0", "t1"], ["t2"], ["t3"], ["t4"]]
    with pytest.raises(ValueError, match="bucket_bytes must be >= 1"):
        next(pack_buckets(iter(source), 0))


def test_exporter_streams_hf_named_buckets_of_the_model():
    from rlinf.models.tiny import TinyModelSettings, random_deepseek_v3

    model = random_deepseek_v3(TinyModelSettings(), vocab_size=40)
    exporter = WeightExporter(lambda: checkpoint_tensors(model))
    dispatch(exporter, "begin", 64 * 1024)
    layouts = list(iter(lambda: dispatch(exporter, "next_bucket"), None))
    names = [n for layout in layouts for n in layout.names]
    assert names == [n for n, _ in checkpoint_tensors(model)] and len(layouts) > 1
    assert any(".mlp.experts.0.gate_proj.weight" in n for n in names)  # per-expert HF names
    assert all(layout.nbytes <= 64 * 1024 or len(layout.names) == 1 for layout in layouts)
    with pytest.raises(RuntimeError, match="no bucket in hand"):
        dispatch(exporter, "ipc_handle")  # the stream is done
    with pytest.raises(ValueError, match="unknown weight export verb 'train'"):
        dispatch(exporter, "train")


def test_nccl_group_ranks():
    plan = nccl_group_plan(num_engines=2, tp_size=4)
    assert plan.world_size == 9 and plan.rank_offsets == (1, 5)


# -- recording fakes for the driver-side order ------------------------------------------------
def layout_of(named):
    ((_, layout),) = pack_buckets(iter(named), 1 << 20)
    return layout


class FakeRoles:
    def __init__(self, colocated, engines=1, tp=1, takes=SGLANG_TAKES):
        self.log = []
        self.colocated = colocated
        layouts = [
            layout_of([("a", torch.zeros(2))]),
            layout_of([("b", torch.zeros(3)), ("c", torch.zeros(1))]),
        ]

        packed = iter(())

        def actor_answer(rank, method, args):
            nonlocal packed
            if method != "weight_export":
                return "cpu-buckets"
            if args[0] == "begin":
                packed = iter(layouts + [None])
            if args[0] == "next_bucket":
                return next(packed)
            return {"ipc_handle": "ipc", "address": ("10.0.0.1", 4242), "gpu_uuid": "GPU-0"}.get(args[0])

        def rollout_answer(rank, method, args):
            if method == "weight_sync_info":
                return {
                    "methods": takes,
                    "tp_size": tp,
                    "gpu_uuids": [f"GPU-{rank * tp + j}" for j in range(tp)],
                }
            return None

        self.actor = FakeGroup("actor", 1, self.log, actor_answer)
        self.rollout = FakeGroup("rollout", engines, self.log, rollout_answer)

    def steps(self):
        """The calls in the order they were made, without waits and the one-off strategy discovery."""
        return [e for e in self.log if e[2] != "weight_sync_info" and ":" not in e[2]]


def test_colocated_sglang_sync_order():
    roles = FakeRoles(colocated=True)
    assert ws.sync_weights(roles, bucket_mb=1) == CUDA_IPC
    assert roles.steps() == [
        ("actor", 0, "weight_export", ("gpu_uuid",)),  # once: which engine TP rank shares its GPU
        ("rollout", 0, "wake", (["weights"],)),  # weights back (empty) before the push
        ("actor", 0, "weight_export", ("begin", 1024 * 1024)),
        ("actor", 0, "weight_export", ("next_bucket",)),
        ("actor", 0, "weight_export", ("ipc_handle",)),
        ("rollout", 0, "update_weights_ipc", (["ipc"],)),
        ("actor", 0, "weight_export", ("next_bucket",)),  # drops bucket 0 only now: the engine has it
        ("actor", 0, "weight_export", ("ipc_handle",)),
        ("rollout", 0, "update_weights_ipc", (["ipc"],)),
        ("actor", 0, "weight_export", ("next_bucket",)),  # None: every weight sent
        ("rollout", 0, "flush_cache", ()),
        ("actor", 0, "weight_export", ("end",)),
    ]  # the KV cache is not resumed here: the runner does it once the actor has offloaded


def test_disaggregated_sglang_sync_order_joins_the_group_once():
    roles = FakeRoles(colocated=False, engines=2, tp=2)
    assert ws.sync_weights(roles, bucket_mb=1) == NCCL
    first = roles.steps()
    assert first[:4] == [
        ("actor", 0, "weight_export", ("address",)),
        ("rollout", 0, "init_weight_group", ("10.0.0.1", 4242, 1, 5, WEIGHT_GROUP_NAME)),
        ("rollout", 1, "init_weight_group", ("10.0.0.1", 4242, 3, 5, WEIGHT_GROUP_NAME)),
        ("actor", 0, "weight_export", ("join_group", "10.0.0.1", 4242, 5, WEIGHT_GROUP_NAME)),
    ]
    assert first[4:] == [
        ("actor", 0, "weight_export", ("begin", 1024 * 1024)),
        ("actor", 0, "weight_export", ("next_bucket",)),
        # every engine is receiving before the actor broadcasts the bucket
        ("rollout", 0, "update_weights_nccl", (["a"], ["float32"], [[2]])),
        ("rollout", 1, "update_weights_nccl", (["a"], ["float32"], [[2]])),
        ("actor", 0, "weight_export", ("broadcast",)),
        ("actor", 0, "weight_export", ("next_bucket",)),
        ("rollout", 0, "update_weights_nccl", (["b", "c"], ["float32", "float32"], [[3], [1]])),
        ("rollout", 1, "update_weights_nccl", (["b", "c"], ["float32", "float32"], [[3], [1]])),
        ("actor", 0, "weight_export", ("broadcast",)),
        ("actor", 0, "weight_export", ("next_bucket",)),
        ("rollout", 0, "flush_cache", ()),
        ("rollout", 1, "flush_cache", ()),
        ("actor", 0, "weight_export", ("end",)),
    ]
    # an engine's receive is awaited only after the actor's broadcast of that bucket was sent
    events = [(e[0], e[2], e[3][:1]) for e in roles.log]
    sent = events.index(("actor", "weight_export", ("broadcast",)))
    waited = events.index(("rollout", "wait:update_weights_nccl", ()))
    assert sent < waited
    roles.log.clear()
    ws.sync_weights(roles, bucket_mb=1)
    assert all(step[3][:1] != ("join_group",) and step[2] != "init_weight_group" for step in roles.log)


def test_embedded_rollout_uses_the_object_store():
    # what RolloutWorker.weight_sync_info reports for a backend that does not override it
    embedded_takes = RolloutWorker.weight_sync_info(None)["methods"]  # type: ignore[arg-type]
    roles = FakeRoles(colocated=True, takes=embedded_takes)
    assert ws.sync_weights(roles, bucket_mb=2) == OBJECT_STORE
    (export, update) = roles.steps()
    assert export == ("actor", 0, "export_weights", (2 * 1024 * 1024,))
    # the rollout gets the export's ObjectRef (resolved by Ray in the worker), not the tensors
    assert update[:3] == ("rollout", 0, "update_weights") and update[3][0].value == "cpu-buckets"


# -- the engine's memory bookkeeping against a recording fake sglang.Engine -------------------
class FakeEngine:
    calls: list = []

    def __init__(self, **kwargs):
        import asyncio

        self.kwargs = kwargs
        self.loop = asyncio.new_event_loop()
        self.tokenizer_manager = type("TM", (), {"auto_create_handle_loop": lambda self: None})()

    def release_memory_occupation(self, tags=None):
        FakeEngine.calls.append(("release", tuple(tags)))

    def resume_memory_occupation(self, tags=None):
        FakeEngine.calls.append(("resume", tuple(tags)))

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        FakeEngine.calls.append(("update", load_format, flush_cache))
        return True, "ok"

    def flush_cache(self):
        FakeEngine.calls.append(("flush",))
        return type("Out", (), {"success": True})()

    async def async_generate(self, input_ids, sampling_params, return_logprob):
        FakeEngine.calls.append(("generate", len(input_ids)))
        return [{"output_ids": [1], "meta_info": {}} for _ in input_ids]


@pytest.fixture
def engine(monkeypatch):
    import rlinf.workers.rollout.sglang_engine as se

    monkeypatch.setattr(se, "import_sglang", lambda: FakeEngine)
    FakeEngine.calls = []
    return se.SGLangEngine({"enable_memory_saver": True}, where="rollout engine (rank 0)")


def test_release_resume_order_around_training(engine):
    engine.generate([[1]], [{}])
    engine.release()  # sleep before training
    with pytest.raises(RuntimeError, match="released and not pushed again"):
        engine.generate([[1]], [{}])
    engine.release()  # idempotent
    engine.resume(["weights"])  # sync: weights first ...
    engine.load_tensors([b"payload"], flattened=True)
    engine.flush_cache()
    engine.resume()  # ... then KV cache and CUDA graphs
    engine.generate([[1]], [{}])
    assert FakeEngine.calls == [
        ("generate", 1),
        ("release", ("kv_cache", "weights", "cuda_graph")),
        ("resume", ("weights",)),
        ("update", "flattened_bucket", False),
        ("flush",),
        ("resume", ("kv_cache", "cuda_graph")),
        ("generate", 1),
    ]


def test_generate_refuses_a_released_kv_cache(engine):
    engine.release(["kv_cache"])
    with pytest.raises(RuntimeError, match=r"\['kv_cache'\] are released"):
        engine.generate([[1]], [{}])


def test_failed_weight_call_names_the_engine(engine, monkeypatch):
    monkeypatch.setattr(
        FakeEngine, "update_weights_from_tensor", lambda self, **kw: (False, "shape mismatch")
    )
    from rlinf.workers.rollout.sglang_engine import EngineCallError

    with pytest.raises(
        EngineCallError, match=r"rollout engine \(rank 0\): SGLang update_weights_from_tensor failed: shape"
    ):
        engine.load_tensors([("a", torch.zeros(1))])


def test_without_memory_saver_release_is_a_no_op(monkeypatch):
    import rlinf.workers.rollout.sglang_engine as se

    monkeypatch.setattr(se, "import_sglang", lambda: FakeEngine)
    FakeEngine.calls = []
    e = se.SGLangEngine({"enable_memory_saver": False}, where="x")
    e.release()
    e.generate([[1]], [{}])
    assert FakeEngine.calls == [("generate", 1)]


def test_end_returns_the_ipc_buffers_to_the_gpu(monkeypatch):
    """Freed buffers an engine opened by IPC sit in torch's IPC limbo until ipc_collect(); only then
    can empty_cache() hand them back to the GPU."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: calls.append("ipc_collect"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    WeightExporter(lambda size: iter([])).end()
    assert calls == ["ipc_collect", "empty_cache"]
