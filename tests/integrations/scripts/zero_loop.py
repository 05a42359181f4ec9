"""The loop of ds_getting_started.py written with ``zerocomm.zero.initialize`` directly (the reference the
DeepSpeed-style script is compared with): same model, data, sampler and config; ``loss.backward()``,
``optimizer.step()``, ``optimizer.zero_grad()`` on every micro-batch.

Launch: torchrun --nproc-per-node 2 zero_loop.py CONFIG.json OUT.json
"""
import json
import sys

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import zerocomm.comm as dist
import zerocomm.zero as zero

config_path, out = sys.argv[1], sys.argv[2]
ds_config = json.loads(open(config_path).read())
if not dist.is_initialized():  # run_scripts.py runs several scripts in one process
    dist.init_process_group()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                          torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        return self.layers(x)


torch.manual_seed(0)
model = Net()
generator = torch.Generator().manual_seed(1)
features = torch.randn(128, 16, generator=generator)
data = TensorDataset(features, (features @ torch.randn(16, 4, generator=generator)).argmax(1))  # learnable labels
model, optimizer = zero.initialize(model, config=ds_config)
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=ds_config["train_micro_batch_size_per_gpu"], sampler=sampler)
criterion = torch.nn.CrossEntropyLoss()
losses = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
if dist.get_rank() == 0:
    with open(out, "w") as f:
        json.dump({"losses": losses, "global_steps": optimizer.global_steps}, f)
