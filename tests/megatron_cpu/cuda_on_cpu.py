"""A test harness: megatron-core's model, DDP buffers and distributed optimizer on the CPU.

megatron-core allocates some tensors with an explicit `device="cuda"` (the optimizer's scale
tensors, DDP's buffers through `torch.cuda.current_device()`), checks `param.type()` against
`torch.cuda.*Tensor` names, and makes CUDA streams. Inside `cuda_on_cpu()` those all land on the
CPU: factory functions and `Tensor.to` map a CUDA device to the CPU, `Tensor.cuda` is the identity,
`Tensor.type()` names a CPU tensor as its CUDA twin, streams and synchronisation do nothing, and
the CUDA RNG state is the CPU's. Only for tests/megatron_cpu; the GPU path never sees it.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils import _device

FACTORIES = (
    "tensor", "as_tensor", "empty", "zeros", "ones", "full", "arange", "rand", "randn", "randint",
    "empty_like", "zeros_like", "ones_like", "full_like",
)  # fmt: skip


def _cpu(device):
    """A CUDA device (name, torch.device) as the CPU; anything else as it is."""
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
        return torch.device("cpu")
    return device


class _Event:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def record_event(self, event=None) -> _Event:
        return event or _Event()

    def wait_stream(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _on_cpu_factory(factory):
    @functools.wraps(factory)
    def make(*args, **kwargs):
        if "device" in kwargs:  # a device index means a GPU here
            device = kwargs["device"]
            kwargs["device"] = torch.device("cpu") if isinstance(device, int) else _cpu(device)
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return make


def _with_listed_splits(all_to_all_single):
    """megatron's MoE dispatcher moves its all-to-all split sizes to the host only from CUDA
    tensors (as numpy arrays); on the CPU they stay tensors, which gloo's binding refuses."""

    @functools.wraps(all_to_all_single)
    def call(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        def listed(sizes):
            return sizes.tolist() if isinstance(sizes, torch.Tensor) else sizes

        return all_to_all_single(
            output, input, listed(output_split_sizes), listed(input_split_sizes), *args, **kwargs
        )

    return call


@contextlib.contextmanager
def cuda_on_cpu():
    to, tensor_type = torch.Tensor.to, torch.Tensor.type

    def to_cpu(self, *args, **kwargs):
        args = tuple(_cpu(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return to(self, *args, **kwargs)

    def cuda_type(self, *args, **kwargs):
        name = tensor_type(self, *args, **kwargs)
        if args or kwargs or not isinstance(name, str) or name.startswith("torch.cuda."):
            return name
        return name.replace("torch.", "torch.cuda.", 1)

    patches = {(torch, name): _on_cpu_factory(getattr(torch, name)) for name in FACTORIES}
    patches |= {
        (torch.Tensor, "to"): to_cpu,
        (torch.Tensor, "cuda"): lambda self, *args, **kwargs: self,
        (torch.Tensor, "type"): cuda_type,
        (torch.cuda, "current_device"): lambda: "cpu",
        (torch.cuda, "synchronize"): lambda device=None: None,
        (torch.cuda, "empty_cache"): lambda: None,
        (torch.cuda, "Stream"): _Stream,
        (torch.cuda, "Event"): _Event,
        (torch.cuda, "stream"): lambda stream: contextlib.nullcontext(),
        (torch.cuda, "current_stream"): lambda *args, **kwargs: _Stream(),
        (torch.cuda, "get_rng_state"): lambda device="cuda": torch.get_rng_state(),
        (torch.cuda, "set_rng_state"): lambda state, device="cuda": None,
        (torch.cuda.random, "get_rng_state"): lambda device="cuda": torch.get_rng_state(),
        (torch.distributed, "all_to_all_single"): _with_listed_splits(torch.distributed.all_to_all_single),
    }
    saved = {key: getattr(*key) for key in patches}
    # `with torch.device(...)` only redirects the functions in torch's lru_cached set of device
    # constructors, built on first use. Built while torch.empty & co. were our wrappers, it would
    # keep the wrappers after the exit: transformers' meta-device init then made real CPU tensors
    # and `from_pretrained` left non-persistent buffers (RoPE's inv_freq) as uninitialised memory.
    _device._device_constructors()  # cached with torch's own functions, before the patches
    for (owner, name), value in patches.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)
        _device._device_constructors.cache_clear()  # in case it was rebuilt with the wrappers
