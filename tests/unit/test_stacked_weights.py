"""rlinf.models.megatron.stacked_weights: expert weights viewed in place where a flat buffer holds them
at a fixed step, and their stacked gradient added into the `main_grad` buffer at once."""

from __future__ import annotations

import torch

from rlinf.models.megatron.stacked_weights import back_to_back, in_place, stacked

SHAPE = (3, 4)


def laid_out(n: int, step: int, order=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A flat buffer holding n [3, 4] tensors, the i-th at offset order[i] * step."""
    order = list(range(n)) if order is None else order
    buffer = torch.arange(float((max(order) + 1) * step + 5))
    return buffer, [buffer[k * step : k * step + 12].view(SHAPE) for k in order]


def test_a_buffer_with_padding_between_the_tensors_is_viewed_in_place():
    buffer, tensors = laid_out(4, step=16)  # 4 elements of padding after each
    view = back_to_back(tensors)
    assert torch.equal(view, torch.stack(tensors))
    buffer[16] = -1.0
    assert view[1, 0, 0] == -1.0  # a view, not a copy


def test_layouts_that_are_not_one_fixed_step_are_refused():
    assert back_to_back(laid_out(3, 12, order=[2, 1, 0])[1]) is None  # reversed: a negative step
    assert back_to_back(laid_out(3, 12, order=[0, 1, 3])[1]) is None  # a gap
    assert back_to_back(laid_out(3, 8)[1][:1] + [torch.zeros(SHAPE)]) is None  # another storage
    _, tensors = laid_out(2, 12)
    assert back_to_back([tensors[0], tensors[1].t()]) is None  # not contiguous
    _, tensors = laid_out(3, 13)
    assert back_to_back(tensors) is None  # expert i at 52 * i bytes: not 16-byte aligned


def parameters_with_main_grads(n: int, step: int):
    data = torch.randn(n * step)
    grads = torch.zeros(n * step, dtype=torch.float64)
    weights = []
    for i in range(n):
        weight = torch.nn.Parameter(data[i * step : i * step + 12].view(SHAPE))
        weight.main_grad = grads[i * step : i * step + 12].view(SHAPE)
        weights.append(weight)
    return weights, grads


def test_the_stacked_gradient_goes_into_main_grad_and_equals_what_stack_gives():
    weights, grads = parameters_with_main_grads(3, 16)
    x = torch.randn(5, 4)

    def loss(stacked_weights):
        return sum(((x @ w.t()) ** 2).sum() * (i + 1) for i, w in enumerate(stacked_weights.unbind(0)))

    loss(stacked(weights, in_place(weights, grad_into_main_grad=True))).backward()
    assert all(w.grad is None for w in weights)
    into_main_grad = [w.main_grad.clone() for w in weights]
    loss(torch.stack(weights)).backward()
    for w, added in zip(weights, into_main_grad, strict=True):
        torch.testing.assert_close(added, w.grad.double())
    assert grads[12] == 0.0  # the padding after a weight is left alone


def test_without_main_grad_use_or_grad_the_weights_keep_autograd_or_are_only_viewed():
    weights, _ = parameters_with_main_grads(2, 12)
    views = in_place(weights, grad_into_main_grad=False)  # overlap_grad_reduce: DDP's hook must run
    copied = stacked(weights, views)
    copied.sum().backward()
    assert all(torch.equal(w.grad, torch.ones(SHAPE)) for w in weights)
    with torch.no_grad():
        viewed = stacked(weights, views)
    assert viewed.data_ptr() == weights[0].data_ptr()
