"""The other forms of ``deepspeed.initialize``'s arguments, on the model and data of ds_getting_started.py:
a torch optimizer built over the model's parameters (instead of the config's optimizer section), a
``collate_fn``, a ``lr_scheduler`` passed as a callable, checkpoints under an explicit tag, and a load from a
folder without ``latest``; and one SGD step under gradient accumulation against a reference computed on one
process.

Launch: torchrun --nproc-per-node 2 ds_variants.py CONFIG.json OUT.json FOLDER   (CONFIG: stage 3, gas 2, a scheduler
section and an AdamW optimizer section, which this script takes out and passes as objects instead)
"""
import json
import sys

import torch
from torch.utils.data import TensorDataset, default_collate

import zerocomm.deepspeed as deepspeed

config_path, out = sys.argv[1], sys.argv[2]
ds_config = json.loads(open(config_path).read())
deepspeed.init_distributed()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                          torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        return self.layers(x)


def data():
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(128, 16, generator=generator)
    return TensorDataset(features, (features @ torch.randn(16, 4, generator=generator)).argmax(1))


def run(engine, loader, epochs=2):
    losses = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for inputs, labels in loader:
            loss = torch.nn.functional.cross_entropy(engine(inputs), labels)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    return losses


report = {}
params = ds_config.pop("optimizer")["params"]

# a torch optimizer over the model's parameters, rebuilt over the shards; the config's scheduler
torch.manual_seed(0)
net = Net()
optimizer = torch.optim.AdamW(net.parameters(), lr=params["lr"], weight_decay=params["weight_decay"])
calls = []


def collate(batch):
    calls.append(len(batch))
    return default_collate(batch)


engine, zero_optimizer, loader, scheduler = deepspeed.initialize(model=net, optimizer=optimizer, config=ds_config,
                                                                 training_data=data(), collate_fn=collate)
report["torch_optimizer_losses"] = run(engine, loader)
report["collate_calls"] = sorted(set(calls))
report["optimizer_class"] = type(zero_optimizer.optimizer).__name__

# a scheduler passed as a callable; explicit tags; a folder without `latest`
del ds_config["scheduler"]
torch.manual_seed(0)
net = Net()
engine, _, loader, scheduler = deepspeed.initialize(
    model=net, optimizer=lambda groups: torch.optim.AdamW(groups, lr=params["lr"]), config=ds_config,
    training_data=data(), lr_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
run(engine, loader, epochs=1)
report["step_lr"] = {"lr": engine.get_lr(), "global_steps": engine.global_steps, "is_engine_scheduler":
                     scheduler is engine.lr_scheduler, "last_epoch": scheduler.last_epoch}
folder = sys.argv[3]
engine.save_checkpoint(folder, tag="mid", client_state={"k": [1, 2]})
engine.save_checkpoint(folder, tag="other", client_state={"k": "other"}, save_latest=False)
torch.manual_seed(0)
fresh, *_ = deepspeed.initialize(model=Net(), optimizer=lambda groups: torch.optim.AdamW(groups, lr=params["lr"]),
                                 config=ds_config,
                                 lr_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
path, client = fresh.load_checkpoint(folder)  # `latest` names "mid": save_latest=False left it
report["load_latest"] = {"client_state": client, "global_steps": fresh.global_steps, "lr": fresh.get_lr()}
path, client = fresh.load_checkpoint(folder, tag="other")
report["load_tag"] = {"client_state": client}
report["load_missing"] = list(fresh.load_checkpoint(folder + "-missing"))

# gradient accumulation against an independent reference: one SGD step (lr 0.1, accumulation 2, 2 ranks) must
# move the parameters by -0.1 x the mean gradient of the 4 micro-batches the ranks saw, computed here on one
# process from the same sampler's indices
sgd_config = {**ds_config, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
torch.manual_seed(0)
net = Net()
reference = Net()
reference.load_state_dict(net.state_dict())
engine, _, loader, _ = deepspeed.initialize(model=net, config=sgd_config, training_data=data())
loader.sampler.set_epoch(0)
batches = iter(loader)
for _ in range(2):
    inputs, labels = next(batches)
    engine.backward(torch.nn.functional.cross_entropy(engine(inputs), labels))
    engine.step()
dataset, world = data(), engine.world_size
grads = [torch.zeros_like(p) for p in reference.parameters()]
for r in range(world):
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=r)
    sampler.set_epoch(0)
    indices = list(sampler)
    for m in range(2):
        x, y = dataset[indices[8 * m:8 * (m + 1)]]
        reference.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        for g, p in zip(grads, reference.parameters()):
            g += p.grad / (2 * world)
with torch.no_grad():
    for g, p in zip(grads, reference.parameters()):
        p -= 0.1 * g
with deepspeed.zero.GatheredParameters(list(net.parameters())):
    report["sgd_step_max_error"] = max((a - b).abs().max().item() for a, b in zip(net.parameters(),
                                                                                  reference.parameters()))
    report["sgd_step_size"] = max(g.abs().max().item() * 0.1 for g in grads)
if engine.global_rank == 0:
    with open(out, "w") as f:
        json.dump(report, f)
