"""``zerocomm.integrations.lightning.ZeroStrategy`` against Lightning's own ``DDPStrategy``.

Two torchrun launches of 2 CPU ranks each run the same tiny LightningModule (an MLP on fixed random data,
no shuffling, AdamW with two parameter groups and a per-step LambdaLR; SGD where noted): one with
``DDPStrategy`` on gloo (the reference, torch's own gradient all_reduce), one with ``ZeroStrategy`` at stages 2
and 3.  Lightning picks up torchrun's environment and starts no processes of its own.  Rank 0 writes each run's
per-batch training losses (the mean over ranks, through ``trainer.strategy.reduce``) and each epoch's
validation loss (``self.log(sync_dist=True)``) to a JSON file.  A sharded optimizer applies the same elementwise
update to the same averaged gradient, so the losses agree to the rounding of the reduction's order (rtol 1e-4;
``-s`` prints the tables).  A run resumed from a Lightning checkpoint (``ModelCheckpoint`` at stage 3,
``trainer.save_checkpoint`` at stage 2) into a module initialised from another seed repeats the uninterrupted
run's second epoch.  A single process (Lightning's own launcher, a world of one) checks what the strategy
refuses, and docs/integrations/lightning.md's script runs as shown.
"""
import importlib.util
import json
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest

# Looked up, not imported: this process forks ranks for other tests and stays light (tests/conftest.py).
if importlib.util.find_spec("lightning") is None:
    pytest.skip("the Lightning integration needs lightning: pip install 'zerocomm[test]'", allow_module_level=True)

from support.launchers import clean_env, launch, tool  # noqa: E402

SCRIPT = textwrap.dedent('''
    """Tiny Lightning runs; argv: OUT.json CKPT_DIR ddp|zero."""
    import json
    import sys

    import torch
    import torch.distributed
    from torch import nn
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy

    import zerocomm.zero as zero
    from zerocomm.integrations.lightning import ZeroStrategy

    OUT, CKPT, KIND = sys.argv[1], sys.argv[2], sys.argv[3]
    FEATURES, HIDDEN, SAMPLES, BATCH, EPOCHS = 16, 32, 64, 4, 2  # 8 batches per rank and epoch


    def data():
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(SAMPLES, FEATURES, generator=generator)
        y = torch.tanh(x @ torch.randn(FEATURES, 1, generator=generator) / 4)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=False)


    class MLP(pl.LightningModule):
        def __init__(self, seed, optim="groups"):
            super().__init__()
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                                     nn.Linear(HIDDEN, 1))
            self.gain = nn.Parameter(torch.ones(1))  # a parameter of the module itself (stage 3's root unit)
            self.optim = optim

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x) * self.gain, y)  # calls a submodule, not forward

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.training_step(batch, batch_idx), sync_dist=True)

        def configure_optimizers(self):
            if self.optim == "adamw":
                return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.0)
            if self.optim == "sgd":  # unlike Adam's, SGD's update scales with the gradient: a wrong average shows
                return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
            decay = [p for n, p in self.named_parameters() if n.endswith("weight")]
            rest = [p for n, p in self.named_parameters() if not n.endswith("weight")]
            optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                           {"params": rest, "weight_decay": 0.0}], lr=1e-2)
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.1 * step))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


    class Losses(Callback):
        def __init__(self):
            self.losses, self.validation = [], []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.losses.append(float(trainer.strategy.reduce(loss.detach(), reduce_op="mean")))

        def on_validation_epoch_end(self, trainer, module):
            self.validation.append(float(trainer.callback_metrics["val_loss"]))  # after each epoch


    def fit(strategy, seed=1, optim="groups", epochs=EPOCHS, callbacks=(), ckpt_path=None, save=None, after=None,
            **options):
        losses = Losses()
        trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=strategy, max_epochs=epochs,
                             logger=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, limit_val_batches=2, enable_checkpointing=bool(callbacks),
                             callbacks=[losses, *callbacks], **options)
        module = MLP(seed, optim)
        trainer.fit(module, data(), data(), ckpt_path=ckpt_path)
        if after:
            after(strategy, module)
        if isinstance(strategy, ZeroStrategy):
            stages.append(strategy.zero_optimizer.stage)
            norms.append(strategy.zero_optimizer.last_grad_norm)  # computed when ZeRO clips
        if save:
            trainer.save_checkpoint(save)
        return {"train": losses.losses, "validation": losses.validation}


    STAGE3 = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}  # gather every unit
    STAGE2 = {"zero_optimization": {"reduce_bucket_size": 600}}  # several buckets
    runs, stages, norms = {}, [], []
    if KIND == "ddp":
        runs["plain"] = fit(DDPStrategy(process_group_backend="gloo"))
        runs["accumulate"] = fit(DDPStrategy(process_group_backend="gloo"), optim="sgd", accumulate_grad_batches=2)
        runs["single"] = fit(DDPStrategy(process_group_backend="gloo"), optim="adamw")
        runs["clipped"] = fit(DDPStrategy(process_group_backend="gloo"), optim="sgd", gradient_clip_val=0.2)
    else:
        runs["stage2"] = fit(ZeroStrategy(stage=2, config=STAGE2))
        runs["stage3"] = fit(ZeroStrategy(stage=3, config=STAGE3))
        runs["stage3_accumulate"] = fit(ZeroStrategy(stage=3, config=STAGE3), optim="sgd", accumulate_grad_batches=2)
        config_optimizer = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}}
        runs["stage2_config_optimizer"] = fit(ZeroStrategy(stage=2, config=config_optimizer), optim="sgd")
        runs["stage2_clipped"] = fit(ZeroStrategy(stage=2, config=STAGE2), optim="sgd", gradient_clip_val=0.2)
        # Resume at stage 3 from ModelCheckpoint's folder, at stage 2 from trainer.save_checkpoint's.
        every_epoch = ModelCheckpoint(dirpath=CKPT, filename="first", save_top_k=-1)
        gathered = {}

        def gather(strategy, module):  # the trained stage 3 module, read as docs/integrations/lightning.md says
            with strategy.zero_optimizer.gathered_parameters():
                gathered.update({key: value.clone() for key, value in module.state_dict().items()})

        runs["stage3_first_epoch"] = fit(ZeroStrategy(stage=3, config=STAGE3), epochs=1, callbacks=[every_epoch],
                                         after=gather)
        if torch.distributed.get_rank() == 0:  # consolidated, loaded into a plain module as the page shows
            state_dict = zero.consolidate(f"{CKPT}/first.ckpt")
            plain = MLP(seed=99)
            plain.load_state_dict({key.removeprefix("module."): value for key, value in state_dict.items()})
            runs["consolidated_gap"] = max(float((plain.state_dict()[key] - value).abs().max())
                                           for key, value in gathered.items())
            runs["consolidated_keys"] = sorted(state_dict)
        runs["stage3_resumed"] = fit(ZeroStrategy(stage=3, config=STAGE3), seed=7, ckpt_path=f"{CKPT}/first.ckpt")
        runs["stage2_first_epoch"] = fit(ZeroStrategy(stage=2, config=STAGE2), epochs=1, save=f"{CKPT}/manual.ckpt")
        runs["stage2_resumed"] = fit(ZeroStrategy(stage=2, config=STAGE2), seed=7, ckpt_path=f"{CKPT}/manual.ckpt")
    if torch.distributed.get_rank() == 0:
        runs["backend"] = torch.distributed.get_backend()
        runs["stages"], runs["norms"] = stages, norms
        with open(OUT, "w") as handle:
            json.dump(runs, handle)
''')


CHECKS = textwrap.dedent('''
    """What ZeroStrategy refuses, and a world of one started by Lightning itself; argv: OUT.json FOLDER."""
    import json
    import sys

    import zerocomm
    import zerocomm.comm as dist
    import zerocomm.integrations
    import zerocomm.zero

    FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "ray", "deepspeed")
    seen = {"frameworks_before": sorted(name for name in FRAMEWORKS if name in sys.modules)}

    import torch
    from torch import nn
    import lightning.pytorch as pl

    from zerocomm.integrations.lightning import ZeroStrategy

    OUT, FOLDER = sys.argv[1], sys.argv[2]


    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        validation_step = training_step

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    def data():
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=1)


    def trainer(strategy, **options):
        return pl.Trainer(accelerator="cpu", devices=1, strategy=strategy, max_epochs=1, logger=False,
                          enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                          num_sanity_val_steps=0, **options)


    def record(name, call):
        try:
            call()
            seen[name] = "no error"
        except Exception as error:  # noqa: BLE001 - the test reads the type and the message
            seen[name] = f"{type(error).__name__}: {error}"


    with open(f"{FOLDER}/ds.json", "w") as handle:
        json.dump({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}, handle)
    record("stage_and_config_differ", lambda: ZeroStrategy(stage=3, config={"zero_optimization": {"stage": 2}}))
    record("accumulation_in_config", lambda: ZeroStrategy(config={"gradient_accumulation_steps": 2}))
    record("stage_5", lambda: ZeroStrategy(stage=5))
    record("missing_config_file", lambda: ZeroStrategy(config=f"{FOLDER}/none.json"))
    record("bad_config_key", lambda: ZeroStrategy(config={"zero_optimization": {"stage": 2, "overlap_comm": "x"}}))
    record("precision", lambda: trainer(ZeroStrategy(), precision="bf16-mixed").fit(Tiny(), data()))
    record("clip_by_value", lambda: trainer(ZeroStrategy(), gradient_clip_val=1.0,
                                            gradient_clip_algorithm="value").fit(Tiny(), data()))
    record("validate", lambda: trainer(ZeroStrategy()).validate(Tiny(), data()))
    seen["initialized_after_refusals"] = dist.is_initialized()

    strategy = ZeroStrategy(config=f"{FOLDER}/ds.json")  # the JSON file's stage 3
    record("fit", lambda: trainer(strategy, gradient_clip_val=0.5).fit(Tiny(), data()))
    seen["fit_stage"] = strategy.zero_optimizer.stage
    seen["fit_clipping"] = strategy.zero_optimizer.config.gradient_clipping
    seen["world"] = [dist.get_world_size(), torch.distributed.get_backend()]
    fp16 = ZeroStrategy(stage=3, config={"fp16": {"enabled": True}})  # ZeRO's loss scale, once per training_step
    record("fp16", lambda: trainer(fp16).fit(Tiny(), data()))
    seen["fp16_steps"] = [fp16.zero_optimizer.step_count, fp16.zero_optimizer.skipped_steps]
    record("partial_cycle", lambda: trainer(ZeroStrategy(stage=2), accumulate_grad_batches=3).fit(Tiny(), data()))
    torch.save({"state_dict": {}}, f"{FOLDER}/plain.ckpt")
    record("file_checkpoint", lambda: trainer(ZeroStrategy(stage=2)).fit(Tiny(), data(),
                                                                          ckpt_path=f"{FOLDER}/plain.ckpt"))
    with open(OUT, "w") as handle:
        json.dump(seen, handle)
''')

def _run(kind: str, folder: Path) -> dict:
    script, out = folder / "train.py", folder / f"{kind}.json"
    script.write_text(SCRIPT)
    done = launch([tool("torchrun"), "--standalone", "--nproc-per-node", "2", str(script), str(out),
                   str(folder / "ckpt"), kind], folder, timeout=240, env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, f"torchrun {kind} exited {done.returncode}:\n{done.stdout[-6000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both launches' losses: {"ddp": {...}, "zero": {...}}."""
    return {kind: _run(kind, tmp_path_factory.mktemp(kind)) for kind in ("ddp", "zero")}


def _relative_gap(losses: list, reference: list) -> float:
    assert len(losses) == len(reference) and all(math.isfinite(v) for v in losses + reference), (losses, reference)
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def _table(name: str, losses: list, reference: list) -> str:
    rows = [f"{name}: batch, DDP (gloo), ZeroStrategy, relative difference"]
    rows += [f"  {step:2d}  {b:.8f}  {a:.8f}  {abs(a - b) / abs(b):.2e}"
             for step, (a, b) in enumerate(zip(losses, reference), 1)]
    return "\n".join(rows)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("zero_run, ddp_run", [("stage2", "plain"), ("stage3", "plain"),
                                               ("stage3_accumulate", "accumulate"),
                                               ("stage2_config_optimizer", "single"), ("stage2_clipped", "clipped")])
def test_losses_match_ddp(runs, zero_run, ddp_run):
    """Per-batch training losses and each epoch's validation loss of ZeroStrategy equal DDPStrategy's within the
    fp32 reduction tolerance (rtol 1e-4), over 16 batches after which the validation loss has fallen by over 10%
    (so the optimizer did act).
    With accumulate_grad_batches=2 (8 steps, SGD: its update scales with the gradient, so a cycle averaged twice,
    or not at all, shows) the micro-batches' losses are compared; the config's optimizer (AdamW) is used in place
    of configure_optimizers' (SGD); with gradient_clip_val=0.2 (SGD; the steps clipped) ZeRO clips by the
    global norm where DDP's Lightning clips the full gradients."""
    ours, theirs = runs["zero"][zero_run], runs["ddp"][ddp_run]
    print("\n" + _table(zero_run, ours["train"], theirs["train"]))
    print(f"  validation: DDP {theirs['validation']}, ZeroStrategy {ours['validation']}")
    if zero_run == "stage2_clipped":
        assert runs["zero"]["norms"][4] > 0.2, runs["zero"]["norms"]  # the last step's norm: clipping acted
    assert len(theirs["train"]) == 16 and len(theirs["validation"]) == 2, theirs
    assert _relative_gap(ours["train"], theirs["train"]) <= 1e-4
    assert _relative_gap(ours["validation"], theirs["validation"]) <= 1e-4
    assert theirs["validation"][1] < 0.9 * theirs["validation"][0], theirs


@pytest.mark.timeout(600)
def test_torch_default_group_is_zerocomm(runs):
    """Lightning's collectives (the loss reduce, ``self.log(sync_dist=True)``, the checkpoint path broadcast) went
    through zerocomm's world, DDP's through gloo; each run trained with the ZeRO stage it asked for."""
    assert runs["zero"]["backend"] == "zerocomm" and runs["ddp"]["backend"] == "gloo"
    assert runs["zero"]["stages"] == [2, 3, 3, 2, 2, 3, 3, 2, 2]  # each ZeroStrategy's ZeroOptimizer, in run order


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", [3, 2])
def test_resume_from_a_lightning_checkpoint_repeats_the_uninterrupted_run(runs, stage):
    """A run stopped after epoch 1 (its checkpoint written by ModelCheckpoint at stage 3, by
    trainer.save_checkpoint at stage 2) and resumed with fit(ckpt_path=...) into a module initialised from
    another seed takes the uninterrupted run's batches 9-16 and its second validation: parameters, Adam's
    moments, the scheduler and the loop counters all came back."""
    zero = runs["zero"]
    whole, first, resumed = zero[f"stage{stage}"], zero[f"stage{stage}_first_epoch"], zero[f"stage{stage}_resumed"]
    gap = max(abs(a - b) for a, b in zip(resumed["train"], whole["train"][8:]))
    print(f"\nstage {stage} resume: max |resumed - uninterrupted| over batches 9-16 = {gap:.3e}; validation "
          f"{resumed['validation']} against {whole['validation'][1:]}")
    assert first["train"] == whole["train"][:8] and first["validation"] == whole["validation"][:1]
    assert len(resumed["train"]) == 8 and _relative_gap(resumed["train"], whole["train"][8:]) <= 1e-6, resumed
    assert _relative_gap(resumed["validation"], whole["validation"][1:]) <= 1e-6, resumed


@pytest.mark.timeout(600)
def test_consolidated_checkpoint_is_the_trained_module(runs):
    """zero.consolidate of a ModelCheckpoint folder, loaded into a plain module with the "module." prefix removed,
    holds the parameters the trained stage 3 module shows inside gathered_parameters()."""
    zero = runs["zero"]
    assert zero["consolidated_keys"] == sorted(["module.gain", "module.net.0.bias", "module.net.0.weight",
                                                "module.net.2.bias", "module.net.2.weight", "module.net.4.bias",
                                                "module.net.4.weight"])
    assert zero["consolidated_gap"] == 0.0


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """What the single-process script (Lightning's own launcher, one rank) saw."""
    folder = tmp_path_factory.mktemp("checks")
    (folder / "checks.py").write_text(CHECKS)
    done = launch([sys.executable, str(folder / "checks.py"), str(folder / "seen.json"), str(folder)], folder,
                  timeout=180, env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, f"checks.py exited {done.returncode}:\n{done.stdout[-6000:]}"
    return json.loads((folder / "seen.json").read_text())


REFUSED = {
    "stage_and_config_differ": "ZeroConfigError: ZeroStrategy: stage=3 but the config's zero_optimization.stage is 2",
    "accumulation_in_config": "ZeroConfigError: ZeroStrategy: the config sets gradient_accumulation_steps (2)",
    "stage_5": "ZeroConfigError: ZeroStrategy: stage must be 0, 1, 2 or 3, got 5",
    "missing_config_file": "ZeroConfigError: ZeroStrategy: config: cannot read the config file",
    "bad_config_key": "ZeroConfigError: DeepSpeed key zero_optimization.overlap_comm must be true or false",
    "precision": "ZeroConfigError: ZeroStrategy: Trainer(precision='bf16-mixed') (MixedPrecision) is not supported",
    "clip_by_value": "ZeroConfigError: ZeroStrategy: Trainer(gradient_clip_algorithm='value') is not supported",
    "validate": "ZeroConfigError: ZeroStrategy: Trainer.validate() is not supported",
    "partial_cycle": "ZeroStateError: rank 0: ZeroStrategy: Lightning stepped the optimizer before ZeRO's "
                     "gradient-accumulation boundary (3 backward pass(es) per step)",
    "file_checkpoint": "CheckpointNotFoundError: rank 0: ",
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", REFUSED)
def test_refusals_are_typed_and_name_what_was_refused(checks, case):
    """Each unsupported setting raises a typed error naming it; the refusals in the strategy's constructor and
    in setup_environment come before any process group exists."""
    assert checks[case].startswith(REFUSED[case]), checks[case]
    assert checks["initialized_after_refusals"] is False


@pytest.mark.timeout(600)
def test_a_world_of_one_from_a_json_config_file(checks):
    """Without torchrun, Lightning's own environment gives zerocomm a world of one; the config's path is read
    (stage 3) and the Trainer's gradient_clip_val reaches ZeRO; the config's fp16 trains (overflowing steps
    skipped)."""
    assert checks["fit"] == "no error" and checks["fp16"] == "no error"
    steps, skipped = checks["fp16_steps"]  # 8 batches: the first ones may overflow at the initial scale, 2**16
    assert steps + skipped == 8 and steps >= 4, checks["fp16_steps"]
    assert (checks["fit_stage"], checks["fit_clipping"], checks["world"]) == (3, 0.5, [1, "zerocomm"])



@pytest.mark.timeout(600)
def test_importing_zerocomm_imports_no_framework(checks):
    """zerocomm, its layers and the integrations package import no framework; only the integration module does."""
    assert checks["frameworks_before"] == []

# -- the page's script ----------------------------------------------------------------------------------------

PAGE = Path(__file__).parents[2] / "docs" / "integrations" / "lightning.md"


def _page_scripts() -> tuple:
    """The page's "before" (DeepSpeed) and "after" (ZeroStrategy) scripts."""
    text = PAGE.read_text()
    after = re.search(r"<!-- lightning-script -->\s*```python\n(.*?)```", text, re.S)
    assert after, f"{PAGE.name} has no python block after <!-- lightning-script -->"
    before = re.search(r"## Before.*?```python\n(.*?)```", text, re.S)
    return before.group(1), after.group(1)


def test_page_shows_the_change_from_deepspeed():
    """Both scripts compile, and they differ only in the lines the page says changed."""
    before, after = _page_scripts()
    compile(before, "before.py", "exec")
    compile(after, "after.py", "exec")
    assert 'strategy="deepspeed_stage_3"' in before and "strategy=ZeroStrategy(stage=3" in after
    changed = set(before.splitlines()) ^ set(after.splitlines())
    assert all(re.search(r"strategy|precision|accelerator|ZeroStrategy|^# train.py|^$", line) for line in changed), \
        changed


@pytest.mark.timeout(600)
def test_page_script_trains_and_checkpoints(tmp_path):
    """The page's script, verbatim, at 2 CPU ranks under torchrun: two epochs of 32 steps, a finite loss printed
    by rank 0, and checkpoints/last.ckpt in ZeRO's layout holding only its newest step."""
    (tmp_path / "train.py").write_text(_page_scripts()[1])
    done = launch([tool("torchrun"), "--standalone", "--nproc-per-node", "2", "train.py"], tmp_path, timeout=240,
                  env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stdout[-6000:]
    printed = re.findall(r"^final train_loss ([-\d.naninf]+)$", done.stdout, re.M)
    assert len(printed) == 1 and math.isfinite(float(printed[0])), done.stdout[-4000:]
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert sorted(p.name for p in last.iterdir()) == ["latest", "step-00000064"], sorted(last.iterdir())
    assert (last / "latest").read_text() == "step-00000064"


def test_page_links_resolve_and_it_is_written_for_users():
    """As tests/test_docs.py asks of the pages in docs/: relative links point at files, no tracker talk."""
    text = PAGE.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets and all((PAGE.parent / target).exists() for target in targets if "://" not in target), targets
    assert not re.search(r"\bissues? #?\d+|\bbars?\b|\bsessions?\b", text, re.I)
