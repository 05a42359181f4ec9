"""ZeRO stage 2 training that saves a checkpoint every SAVE_EVERY steps and resumes from the checkpoint
root's ``latest`` when one exists: what an elastic job does when torchrun restarts it.

    torchrun --nproc-per-node N --max-restarts 1 elastic_train.py ROOT OUT STEPS DIE_AT

On the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0) rank 1 kills itself just before step DIE_AT
(-1: never).  Rank 0 writes the final parameters to OUT.  Each step's data depends on the step and the
rank only, so a resumed run sees the same batches as an uninterrupted one.
"""
import os
import sys

import torch

import zerocomm.comm as dist
import zerocomm.zero as zero

SAVE_EVERY = 2

root, out, steps, die_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group()
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
model, optimizer = zero.initialize(model, lambda params: torch.optim.Adam(params, lr=1e-2), {"stage": 2})
if os.path.exists(os.path.join(root, "latest")):
    optimizer.load(root)
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
print(f"rank {rank} attempt {attempt} starts at step {optimizer.step_count}", flush=True)
for step in range(optimizer.step_count, steps):
    if attempt == 0 and rank == 1 and step == die_at:
        os._exit(17)  # as a crashed rank would: no clean-up, no goodbye
    generator = torch.Generator().manual_seed(1000 * step + rank)
    inputs, targets = torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if optimizer.step_count % SAVE_EVERY == 0:
        optimizer.save(root)
# The final model as a user saves it, straight after the last step: state_dict waits for the step's parameter
# all_gather, still in flight here.
final = model.state_dict()
if rank == 0:
    torch.save(final, out)
dist.destroy_process_group()
