"""A training script as DeepSpeed's getting-started page writes one (argparse with
``deepspeed.add_config_arguments``, ``deepspeed.initialize(args=..., model=..., model_parameters=...,
training_data=...)``, ``model_engine(inputs)`` / ``backward`` / ``step``, ``save_checkpoint`` /
``load_checkpoint`` with ``client_state``).  It imports the real ``deepspeed``: the test runs a copy whose
import line alone is changed to ``import zerocomm.deepspeed as deepspeed``.

Launch: torchrun --nproc-per-node 2 ds_getting_started.py --deepspeed --deepspeed_config ds.json --out losses.json
[--save_dir D --save_at S] [--load_dir D [--ckpt_id TAG]]
"""
import argparse
import json
import sys

import torch
from torch.utils.data import TensorDataset

import deepspeed


def add_argument():
    parser = argparse.ArgumentParser(description="getting started")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save_dir", default=None)
    parser.add_argument("--save_at", type=int, default=-1, help="save after this many micro-steps")
    parser.add_argument("--load_dir", default=None)
    parser.add_argument("--ckpt_id", default=None)
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                          torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        return self.layers(x)


cmd_args = add_argument()
deepspeed.init_distributed()
torch.manual_seed(0)
net = Net()
generator = torch.Generator().manual_seed(1)
features = torch.randn(128, 16, generator=generator)
trainset = TensorDataset(features, (features @ torch.randn(16, 4, generator=generator)).argmax(1))  # learnable labels
criterion = torch.nn.CrossEntropyLoss()

parameters = filter(lambda p: p.requires_grad, net.parameters())
model_engine, optimizer, trainloader, __ = deepspeed.initialize(args=cmd_args, model=net, model_parameters=parameters,
                                                                training_data=trainset)

step, client_sd = 0, {}
if cmd_args.load_dir:
    _, client_sd = model_engine.load_checkpoint(cmd_args.load_dir, cmd_args.ckpt_id)
    step = client_sd["step"]

losses, seen = [], 0
for epoch in range(cmd_args.epochs):
    trainloader.sampler.set_epoch(epoch)
    for i, data in enumerate(trainloader):
        seen += 1
        if seen <= step:
            continue  # advance the data loader to the checkpoint's step
        inputs, labels = data[0].to(model_engine.device), data[1].to(model_engine.device)
        outputs = model_engine(inputs)
        loss = criterion(outputs, labels)
        model_engine.backward(loss)
        model_engine.step()
        losses.append(loss.item())
        if seen == cmd_args.save_at:
            client_sd["step"] = seen
            client_sd["note"] = {"epoch": epoch, "lr": model_engine.get_lr()}
            model_engine.save_checkpoint(cmd_args.save_dir, client_state=client_sd)

if model_engine.global_rank == 0:
    with open(cmd_args.out, "w") as f:
        json.dump({"losses": losses, "client_state": client_sd, "global_steps": model_engine.global_steps,
                   "micro": model_engine.train_micro_batch_size_per_gpu(),
                   "accumulation": model_engine.gradient_accumulation_steps(),
                   "modules": sorted(name for name in sys.modules if name.split(".")[0] == "deepspeed")}, f)
