"""Plain-PyTorch float64 implementation of the kernel contract in csrc/syncbn.h.

The tests compare the compiled kernels op by op against these definitions; they are written for
clarity (float64 throughout), not speed.
"""
from __future__ import annotations

import torch


def _to_nc_rest(x: torch.Tensor) -> torch.Tensor:
    """(N, C, *) -> (C, N*prod(*)) in float64, whatever the memory format."""
    c = x.shape[1]
    return x.transpose(0, 1).reshape(c, -1).double()


def _bshape(x: torch.Tensor) -> list[int]:
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def batch_norm_stats(x: torch.Tensor) -> torch.Tensor:
    flat = _to_nc_rest(x)
    c, n = flat.shape
    if n == 0:
        mean = torch.zeros(c, dtype=torch.float64, device=x.device)
        m2 = torch.zeros_like(mean)
    else:
        mean = flat.mean(1)
        m2 = ((flat - mean[:, None]) ** 2).sum(1)
    count = torch.tensor([float(n)], dtype=torch.float64, device=x.device)
    return torch.cat([count, mean, m2])


def batch_norm_gather_stats(gathered, running_mean, running_var, num_batches_tracked, momentum, eps, acc_double):
    c = (gathered.shape[1] - 1) // 2
    counts, means, m2s = gathered[:, 0], gathered[:, 1 : 1 + c], gathered[:, 1 + c :]
    n = counts.sum()
    acc = torch.float64 if acc_double else torch.float32
    if n == 0:
        z = torch.zeros(c, dtype=acc, device=gathered.device)
        return z, z.clone(), n
    mean = (counts[:, None] * means).sum(0) / n
    m2 = m2s.sum(0) + (counts[:, None] * (means - mean) ** 2).sum(0)
    invstd = torch.rsqrt(m2 / n + eps)
    if running_mean is not None:
        f = momentum if momentum >= 0 else 1.0 / float(num_batches_tracked)
        unbiased = m2 / (n - 1)
        running_mean.mul_(1 - f).add_((f * mean).to(running_mean.dtype))
        running_var.mul_(1 - f).add_((f * unbiased).to(running_var.dtype))
    return mean.to(acc), invstd.to(acc), n


def batch_norm_elemt(x, weight, bias, mean, invstd):
    s = _bshape(x)
    y = (x.double() - mean.double().view(s)) * invstd.double().view(s)
    if weight is not None:
        y = y * weight.double().view(s)
    if bias is not None:
        y = y + bias.double().view(s)
    return y.to(x.dtype)


def batch_norm_backward_reduce(dy, x, mean, invstd):
    s = _bshape(x)
    xhat = (x.double() - mean.double().view(s)) * invstd.double().view(s)
    sum_dy = _to_nc_rest(dy).sum(1)
    sum_dy_xhat = _to_nc_rest(dy.double() * xhat).sum(1)
    return torch.cat([sum_dy, sum_dy_xhat]).to(_acc(x))


def batch_norm_backward_elemt(dy, x, mean, invstd, weight, reduced, count):
    s = _bshape(x)
    c = x.shape[1]
    n = float(count)
    xhat = (x.double() - mean.double().view(s)) * invstd.double().view(s)
    sum_dy, sum_dy_xhat = reduced[:c].double(), reduced[c:].double()
    g = invstd.double().view(s)
    if weight is not None:
        g = g * weight.double().view(s)
    if n == 0:
        return torch.zeros_like(x)
    dx = g * (dy.double() - sum_dy.view(s) / n - xhat * sum_dy_xhat.view(s) / n)
    return dx.to(x.dtype)
