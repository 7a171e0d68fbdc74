"""ms-swift plugin that makes DeepSpeed ZeRO-1/2/3 train on CPU (gloo); pass it as
`swift sft ... --use_cpu true --deepspeed zero2 --external_plugins <this file>`.

ms-swift imports `--external_plugins` files while parsing its arguments, in every rank,
before the model is loaded. On a machine with CUDA this file does nothing.

Two problems, seen with torch 2.13 (CPU) + deepspeed 0.18.9 + transformers 5.19:

1. ZeRO-1/2 die in the optimizer step with "Output 0 of Split is a view and is being
   modified inplace": DeepSpeed all-gathers the updated weights into its flat bit16
   buffer, which requires grad, outside `no_grad`; gloo's `all_gather_into_tensor`
   writes into split views of that output, which autograd forbids (NCCL never splits).
   Fix: run that all-gather under `torch.no_grad()`.
2. ZeRO-3 dies at model load with "train_batch_size is not equal to micro_batch_per_gpu
   * gradient_acc_step * world_size 8 != 4 * 1 * 1": `zero.Init` reads the world size
   from `deepspeed.comm`, which transformers only initialises on its GPU path (with
   `--use_cpu true` it sets up plain torch.distributed later). Fix: initialise
   `deepspeed.comm` with gloo here, in each torchrun worker.
"""

import functools
import os

import torch

if not torch.cuda.is_available():
    import deepspeed
    import deepspeed.runtime.zero.stage_1_and_2 as _zero12

    _all_gather_dp_groups = _zero12.all_gather_dp_groups

    @functools.wraps(_all_gather_dp_groups)
    def _all_gather_dp_groups_no_grad(*args, **kwargs):
        with torch.no_grad():
            return _all_gather_dp_groups(*args, **kwargs)

    _zero12.all_gather_dp_groups = _all_gather_dp_groups_no_grad

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        deepspeed.init_distributed(dist_backend="gloo")
