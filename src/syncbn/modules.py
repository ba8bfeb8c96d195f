"""SyncBatchNorm modules: state and argument checks; the maths lives in functions.py.

Drop-in for nn.BatchNormXd / nn.SyncBatchNorm: same constructor, parameters, buffers and state_dict
keys, so checkpoints move freely between `norm=bn` and `norm=syncbn`. Unlike nn.SyncBatchNorm it
runs on the CPU (gloo) as well as on GPUs, and uneven or empty per-rank batches are exact.
"""
from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .collectives import resolve_group
from .exchange_tag import ExchangeTag
from .functions import sync_batch_norm
from .recompute import ledger_of, recomputing
from .selfcheck import check_first_use

# PyTorch 2.11's nn.BatchNorm has no bias= (2.13's has); SyncBatchNorm passes it on only where it exists.
_BATCHNORM_TAKES_BIAS = "bias" in inspect.signature(_BatchNorm.__init__).parameters


class SyncBatchNorm(_BatchNorm):
    """Batch norm whose training statistics span every rank of `process_group` (default: WORLD).

    Accepts (N, C) to (N, C, D, H, W) input. In training mode it equals nn.BatchNorm applied to the
    concatenation of all ranks' batches; in eval mode it uses the running statistics and never
    communicates. Without a process group, or in a group of one, it is plain batch norm.
    `process_group=None` is resolved to WORLD at forward time, so a model may be built before
    init_process_group.

    Communication-saving modes (off by default; set them with `configure_sync`, docs/syncbn.md):
    `group_size=k` shares statistics within groups of k consecutive ranks instead of `process_group`;
    `sync_every=N` synchronises every N-th training forward (counted by num_batches_tracked, so the
    schedule survives a resume) and uses this rank's batch alone in between; `sync_until_step=S`
    synchronises while `optimizer_step < S` (the trainer keeps `optimizer_step` current via
    `set_optimizer_step`), per-rank statistics after. A local forward's backward is local too.
    """

    # Class-level defaults (exact behaviour); instances override them.
    group_size: Optional[int] = None
    sync_every: int = 1
    sync_until_step: Optional[int] = None
    optimizer_step: int = 0
    _forwards: Optional[int] = None  # this layer's training forwards before the current one (sync_every)
    # How the forward's statistics travel (functions.py): "all_reduce" (two collectives, 2C+1 values whatever the
    # world size) or "all_gather" (one collective of W(2C+1) values). The same merge either way.
    exchange: str = "all_reduce"
    _checked_on: Optional[torch.device] = None  # the CUDA device whose self-check this layer has seen done
    # The identity its exchanges carry, so that ranks out of step are found (exchange_tag.py): the position among
    # its model's SyncBatchNorm layers (out_of_step.number_layers; 0: never numbered), and the tag that counts
    # its calls (made in __init__, moved with the layer; None only in a layer pickled before tags existed).
    sync_layer_index: int = 0
    _exchange_tag: Optional[ExchangeTag] = None

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Optional[Any] = None,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        if not bias and not _BATCHNORM_TAKES_BIAS:
            raise ValueError(f"{type(self).__name__}(bias=False) needs a PyTorch whose nn.BatchNorm takes bias= (2.13 "
                             f"and later); this one is {torch.__version__}: keep bias=True or upgrade PyTorch")
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype,
                         **({"bias": bias} if _BATCHNORM_TAKES_BIAS else {}))
        self.process_group = process_group
        # Made now, on the layer's device, rather than in a first forward that torch.compile may be tracing.
        own = self._own_device()
        self._exchange_tag = ExchangeTag(own if own is not None else torch.empty(0, device=device).device, 0)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _check_channels(self, input: torch.Tensor) -> None:
        if input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        if input.size(1) != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}) got input of shape {tuple(input.shape)} "
                f"with {input.size(1)} channels in dim 1; build the layer with num_features={input.size(1)}"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalise `input` with group-wide batch statistics (training) or running statistics (eval)."""
        self._check_input_dim(input)
        self._check_channels(input)
        if getattr(self, "_is_replica", False):
            raise RuntimeError(
                f"{type(self).__name__} does not work inside nn.DataParallel (this module is a "
                "DataParallel replica): run one process per device with torchrun and wrap the model in "
                "torch.nn.parallel.DistributedDataParallel instead"
            )

        # An activation checkpoint's recomputation of a training forward reuses that forward's
        # statistics (recompute.py): no collective, no second count or running-statistics update.
        # Compiled graphs never see this bookkeeping (config validation refuses compile + checkpointing).
        record = replay = None
        if self.training and not torch.compiler.is_compiling():
            if recomputing():
                replay = ledger_of(self).take(type(self).__name__)
            elif torch.is_grad_enabled():
                record = ledger_of(self).record()

        if self.training and self.track_running_stats and self.num_batches_tracked is not None and replay is None:
            # Counted before the statistics, as _BatchNorm does; the cumulative average
            # (momentum=None) reads it on the device, so no host sync here.
            self.num_batches_tracked.add_(1)

        if not self.training:
            # Eval: running statistics (or, without buffers, this batch's own): never communicates.
            bn_training = self.running_mean is None and self.running_var is None
            output = F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, bn_training, 0.0, self.eps
            )
            if output.requires_grad and not torch.compiler.is_compiling() and not recomputing():
                # A training step taken in eval mode is a call its peers' exchanges count: counted when its
                # gradient arrives (exchange_tag.py), so a forward that no backward follows, e.g. evaluating
                # on one rank, counts nothing. Compiled graphs cannot run this hook: there it counts nothing.
                output.register_hook(self._tag(input.device).count_backward)
            return output

        tag = self._tag(input.device)
        if replay is None:
            tag.count_call()

        if input.is_cuda and input.device != self._checked_on and not torch.compiler.is_compiling():
            # Our CUDA kernels' self-check, once per device and process (agreed on this layer's group), unless the
            # trainer's gate ran it.
            check_first_use(input.device, self.process_group, self.group_size)
            self._checked_on = input.device
        if self.eps <= 0.0:  # same check and words as F.batch_norm, which this path does not call
            raise ValueError(f"batch_norm eps must be positive during training, but got {self.eps}")
        track = self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        num_batches_tracked = self.num_batches_tracked if track else None
        if self.momentum is not None:
            momentum = float(self.momentum)
        else:  # cumulative average: the kernel uses 1 / num_batches_tracked (negative = that mode)
            momentum = -1.0 if num_batches_tracked is not None else 0.0
        # A replay communicates nothing, and must not advance sync_every's forward counter.
        group_name, world_size = ("", 1) if replay is not None else self._sync_group()
        return sync_batch_norm(
            input, self.weight, self.bias, running_mean, running_var, num_batches_tracked,
            momentum, float(self.eps), group_name, world_size, record, replay, self.exchange,
            tag.identity, tag.first_out_of_step,
        )

    def _tag(self, device: torch.device) -> ExchangeTag:
        """This layer's exchange tag on `device` (made, or moved there with its count, on first use there)."""
        tag = self._exchange_tag
        if tag is None or tag.device != device:
            tag = self._exchange_tag = (ExchangeTag(device, self.sync_layer_index) if tag is None
                                        else tag.moved_to(device, self.sync_layer_index))
        return tag

    def set_sync_layer_index(self, index: int) -> None:
        """Carry `index` as this layer's identity in its exchanges (out_of_step.number_layers numbers a model's)."""
        self.sync_layer_index = index
        device, tag = self._own_device(), self._exchange_tag
        if device is None:  # no parameters or buffers: where the tag is, unless it has no values yet
            device = tag.device if tag is not None and tag.device.type != "meta" else torch.device("cpu")
        self._tag(device).set_index(index)

    def _apply(self, fn: Any, recurse: bool = True) -> "SyncBatchNorm":
        # .to() / .cuda() move the exchange tag with the parameters and buffers (it is neither: not in state_dict,
        # not broadcast by DDP); dtype changes leave it float64.
        super()._apply(fn, recurse)
        device = self._own_device()
        if device is not None:
            self._tag(device)
        return self

    def _own_device(self) -> Optional[torch.device]:
        """The device of the layer's running statistics or weight; None when it has neither."""
        reference = next((t for t in (self.running_mean, self.weight) if t is not None), None)
        return None if reference is None else reference.device

    def _sync_group(self) -> tuple[str, int]:
        """(group name, size) this training forward normalises over; ("", 1) = this rank's batch alone.

        The one place that decides whether a forward communicates; the backward follows its forward
        (functions.py keeps the group and size the forward used).
        """
        if self.sync_until_step is not None and self.optimizer_step >= self.sync_until_step:
            return "", 1
        if self.sync_every > 1:
            if self._forwards is None:  # sync_every set without configure_sync or a load: one host read, once
                self.reset_sync_phase()
                self._forwards -= 1  # forward() has already counted this forward in num_batches_tracked
            index, self._forwards = self._forwards, self._forwards + 1
            if index % self.sync_every:
                return "", 1
        return resolve_group(self.process_group, self.group_size)

    def reset_sync_phase(self) -> None:
        """Take sync_every's phase from num_batches_tracked (the training forwards so far): one host read, which
        configure_sync and load_state_dict make here, outside any training step, so that no step reads one."""
        tracked = self.num_batches_tracked if self.track_running_stats else None
        self._forwards = int(tracked) if tracked is not None else 0

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._forwards = None
        if self.sync_every > 1:  # the loaded num_batches_tracked sets the phase
            self.reset_sync_phase()

    def extra_repr(self) -> str:
        modes = [f"{key}={getattr(self, key)}" for key, default in
                 (("group_size", None), ("sync_every", 1), ("sync_until_step", None)) if getattr(self, key) != default]
        return ", ".join([super().extra_repr(), *modes])


class SyncBatchNorm1d(SyncBatchNorm):
    """SyncBatchNorm for (N, C) or (N, C, L) input, like nn.BatchNorm1d."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 2 and input.dim() != 3:
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class SyncBatchNorm2d(SyncBatchNorm):
    """SyncBatchNorm for (N, C, H, W) input, like nn.BatchNorm2d."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


class SyncBatchNorm3d(SyncBatchNorm):
    """SyncBatchNorm for (N, C, D, H, W) input, like nn.BatchNorm3d."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 5:
            raise ValueError(f"expected 5D input (got {input.dim()}D input)")
