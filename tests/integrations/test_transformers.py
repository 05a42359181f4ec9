"""``zerocomm.integrations.transformers.ZeroTrainer`` against Hugging Face's own ``Trainer`` with DDP.

Ranks start under torchrun, as users start them, from a script written into the test's folder; each rank
trains a tiny GPT-2 built from a config (2 layers, 32 wide, vocabulary 96; no download) on a fixed synthetic
dataset, with ``gradient_accumulation_steps`` 2, clipping active (``max_grad_norm`` 0.3, below the
gradients' norm) and a linear schedule, and writes its per-step losses to a JSON file the test reads.

The reference is ``transformers.Trainer`` on the same world (after ``zerocomm.comm.init_process_group()``
its DDP rides the "zerocomm" c10d backend).  ZeRO averages the same gradients with another reduction
schedule and computes the clipping norm in float64 over shards while the Trainer's is float32 over whole
gradients, so the losses may differ in the last float32 bits: rtol 1e-4 bounds that over six steps.
"""
import json
import math

import pytest

from support.launchers import clean_env, launch, tool

pytest.importorskip("transformers", reason="needs transformers: pip install 'zerocomm[test]'")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate: pip install 'zerocomm[test]'")

RTOL = 1e-4
STEPS = 6

RANK_SCRIPT = r'''
import json, os, sys
import torch
import zerocomm.comm as dist
dist.init_process_group()
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from zerocomm.integrations.transformers import ZeroTrainer
from zerocomm.zero import CheckpointNotFoundError, ZeroConfigError

transformers.logging.set_verbosity_error()
OUT, PARTS, STEPS = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
rank, world = dist.get_rank(), dist.get_world_size()
PROMPT = torch.tensor([[5, 17, 42, 8]])


class Tokens(torch.utils.data.Dataset):
    """32 fixed random sequences of 16 tokens (labels = inputs: causal LM)."""
    def __init__(self, n=32):
        self.ids = torch.randint(0, 96, (n, 16), generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Losses(TrainerCallback):
    def __init__(self):
        self.losses, self.grad_norms = {}, {}
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses[state.global_step] = logs["loss"]
            self.grad_norms[state.global_step] = logs.get("grad_norm")


def tiny_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=32,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def arguments(name, **overrides):
    settings = dict(output_dir=os.path.join(OUT, name), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                    learning_rate=1e-3, weight_decay=0.01, max_grad_norm=0.3, max_steps=STEPS, logging_steps=1,
                    save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    settings.update(overrides)
    return TrainingArguments(**settings)


BATCH = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
         "gradient_clipping": "auto"}


def train(trainer, **kwargs):
    log = Losses()
    trainer.add_callback(log)
    trainer.train(**kwargs)
    return {"losses": log.losses, "grad_norms": log.grad_norms}


result = {}
if "compare" in PARTS:
    # Stage 3 with the Trainer's own optimizer (AdamW, weight decay on all but biases and norms), stage 2 with
    # the config's optimizer section filled from the TrainingArguments ("auto"), each beside plain DDP.
    for name, stage, weight_decay, section in (("stage3", 3, 0.01, None), ("stage2", 2, 0.0, "auto")):
        args = arguments(f"ddp-{name}", weight_decay=weight_decay)
        ddp = Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens())
        result[f"ddp-{name}"] = train(ddp)
        result[f"ddp-{name}"]["eval_loss"] = ddp.evaluate(Tokens(12))["eval_loss"]
        config = {**BATCH, "zero_optimization": {"stage": stage}}
        if section:
            config["optimizer"] = {"type": "AdamW", "params": {key: "auto" for key in ("lr", "betas", "eps",
                                                                                         "weight_decay")}}
        args = arguments(f"zero-{name}", weight_decay=weight_decay)
        trainer = ZeroTrainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(), zero_config=config)
        result[name] = train(trainer)
        result[name]["eval_loss"] = trainer.evaluate(Tokens(12))["eval_loss"]  # stage 3: gathered unit by unit
        result[name]["stage"] = trainer.zero_optimizer.stage
        result[name]["ddp_wrapped"] = isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel)

for WHAT in [part for part in PARTS if part in ("full", "resume")]:
    # Stage 3, the config's optimizer and schedule (every value "auto"), a checkpoint at step STEPS // 2.
    config = {**BATCH, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                        "weight_decay": "auto"}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                                "warmup_num_steps": "auto",
                                                                "total_num_steps": "auto"}}}
    path = os.path.join(OUT, "ds_config.json")
    if WHAT == "full" and rank == 0:
        with open(path, "w") as f:
            json.dump(config, f)
    dist.barrier()
    args = arguments("run" if WHAT == "full" else f"resumed-{world}", save_strategy="steps", save_steps=STEPS // 2,
                     warmup_steps=2)
    trainer = ZeroTrainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(), zero_config=path)
    checkpoint = os.path.join(OUT, "run", f"checkpoint-{STEPS // 2}")
    result[WHAT] = train(trainer, **({"resume_from_checkpoint": checkpoint} if WHAT == "resume" else {}))
    result[WHAT].update(global_step=trainer.state.global_step, lrs=trainer.zero_optimizer.get_lr())
    if WHAT == "full":
        trainer.save_model(os.path.join(OUT, "final"))
        trainer.model.eval()
        with torch.no_grad():  # every rank: stage 3 gathers each unit from every rank's shard
            result[WHAT]["generated"] = trainer.model.generate(PROMPT, max_new_tokens=8, do_sample=False,
                                                               pad_token_id=0).tolist()
            result[WHAT]["logits"] = trainer.model(PROMPT).logits[0, -1].tolist()
    else:
        result[WHAT]["config"] = trainer.zero_config_dict

if "pretrained" in PARTS:
    model = GPT2LMHeadModel.from_pretrained(os.path.join(OUT, "final")).eval()
    with torch.no_grad():
        result["generated"] = model.generate(PROMPT, max_new_tokens=8, do_sample=False, pad_token_id=0).tolist()
        result["logits"] = model(PROMPT).logits[0, -1].tolist()
    # What is refused, and how.
    refusals = {}
    def refused(name, make):
        try:
            make()
        except (ZeroConfigError, CheckpointNotFoundError) as error:
            refusals[name] = [type(error).__name__, str(error)]
    refused("unknown key", lambda: ZeroTrainer(model=tiny_gpt2(), args=arguments("k"), train_dataset=Tokens(),
                                               zero_config={"zero_optimization": {"stage": 2, "no_such": 1}}).train())
    refused("mismatches", lambda: ZeroTrainer(model=tiny_gpt2(), args=arguments("m"), train_dataset=Tokens(),
                                              zero_config={"gradient_clipping": 1.0, "gradient_accumulation_steps": 3,
                                                           "zero_optimization": {"stage": 2}}).train())
    opt = torch.optim.SGD(tiny_gpt2().parameters(), lr=0.1)
    refused("optimizers", lambda: ZeroTrainer(model=tiny_gpt2(), args=arguments("o"), optimizers=(opt, None),
                                              zero_config={"zero_optimization": {"stage": 2}}))
    refused("partial cycle", lambda: ZeroTrainer(model=tiny_gpt2(), args=arguments("p", gradient_accumulation_steps=3,
                                                                                   max_steps=-1),
                                                 train_dataset=Tokens(), zero_config={"zero_optimization":
                                                                                      {"stage": 2}}).train())
    refused("not elementwise", lambda: ZeroTrainer(model=tiny_gpt2(), args=arguments("a", optim="adafactor"),
                                                   train_dataset=Tokens(),
                                                   zero_config={"zero_optimization": {"stage": 2}}).train())
    result["refusals"] = refusals

with open(os.path.join(OUT, f"{sys.argv[2]}-rank{rank}-of-{world}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
'''


def _run(tmp_path, what: str, nprocs: int) -> list:
    """Launch the rank script for ``what`` on ``nprocs`` CPU ranks; every rank's result, in rank order."""
    script = tmp_path / "rank_script.py"
    script.write_text(RANK_SCRIPT)
    done = launch([tool("torchrun"), "--standalone", "--nproc-per-node", str(nprocs), str(script), str(tmp_path),
                   what, str(STEPS)], tmp_path, timeout=240, env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, f"{what} on {nprocs} ranks exited {done.returncode}:\n{done.stdout[-6000:]}"
    return [json.loads((tmp_path / f"{what}-rank{r}-of-{nprocs}.json").read_text()) for r in range(nprocs)]


def _losses(run: dict) -> list:
    return [run["losses"][str(step)] for step in range(1, STEPS + 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three launches in one folder: on 2 ranks the comparisons with DDP and the uninterrupted stage-3 run (a
    checkpoint at step 3, the model saved at the end); on 2 ranks again the resume from step 3; on 1 rank the
    resume of the same checkpoint, ``from_pretrained`` of the saved model, and the refusals."""
    folder = tmp_path_factory.mktemp("zero_trainer")
    return {"two": _run(folder, "compare,full", 2), "resumed": _run(folder, "resume", 2),
            "one": _run(folder, "resume,pretrained", 1)[0]}


def test_zero_trainer_matches_ddp_at_stages_2_and_3(runs):
    for rank_result in runs["two"]:
        for name, stage in (("stage2", 2), ("stage3", 3)):
            zero_run, ddp_run = rank_result[name], rank_result[f"ddp-{name}"]
            assert zero_run["stage"] == stage and not zero_run["ddp_wrapped"], zero_run
            assert _losses(zero_run) == pytest.approx(_losses(ddp_run), rel=RTOL), (name, zero_run, ddp_run)
            # Clipping was active (the norm above max_grad_norm 0.3) and both report the same pre-clip norm.
            zero_norms = [zero_run["grad_norms"][str(s)] for s in range(1, STEPS + 1)]
            ddp_norms = [ddp_run["grad_norms"][str(s)] for s in range(1, STEPS + 1)]
            assert min(ddp_norms) > 0.3, ddp_norms
            assert zero_norms == pytest.approx(ddp_norms, rel=1e-3), (name, zero_norms, ddp_norms)
            # Evaluation after training (each rank its part of 12 sequences, the losses gathered) agrees too.
            assert zero_run["eval_loss"] == pytest.approx(ddp_run["eval_loss"], rel=RTOL), (name, zero_run, ddp_run)
        # The losses moved: the comparison is of training, not of six copies of the first loss.
        assert len(set(_losses(rank_result["stage3"]))) == STEPS


def test_resume_equals_the_uninterrupted_run_and_resumes_at_another_world_size(runs):
    later = [str(s) for s in range(STEPS // 2 + 1, STEPS + 1)]
    for uninterrupted, again in zip((r["full"] for r in runs["two"]), (r["resume"] for r in runs["resumed"])):
        assert sorted(again["losses"], key=int) == later, again["losses"]
        assert [again["losses"][s] for s in later] == \
            pytest.approx([uninterrupted["losses"][s] for s in later], rel=1e-6)
        assert again["lrs"] == pytest.approx(uninterrupted["lrs"], rel=1e-9)
        scheduler = again["config"]["scheduler"]["params"]
        assert scheduler["total_num_steps"] == STEPS and scheduler["warmup_num_steps"] == 2, scheduler
        assert scheduler["warmup_max_lr"] == 1e-3 and scheduler["warmup_min_lr"] == 0, scheduler
    # The checkpoint written by 2 ranks, resumed by 1: ZeRO reshards it, and training continues to the end.
    one = runs["one"]["resume"]
    assert one["global_step"] == STEPS, one
    assert sorted(one["losses"], key=int) == later and all(math.isfinite(v) for v in one["losses"].values()), one
    # It starts from the 2-rank run's state (its first loss is near that run's, far from a fresh model's), at
    # the schedule's step 4 (the same lr as the 2-rank run at the end).
    full = runs["two"][0]["full"]["losses"]
    assert abs(one["losses"][later[0]] - full[later[0]]) < 0.5 * abs(full["1"] - full[str(STEPS)]), (one, full)
    assert one["lrs"] == pytest.approx(runs["two"][0]["full"]["lrs"], rel=1e-9)


def test_saved_model_loads_with_from_pretrained_and_generates_the_same_tokens(runs):
    trained = [r["full"] for r in runs["two"]]
    loaded = runs["one"]
    assert trained[0]["generated"] == trained[1]["generated"]
    assert loaded["generated"] == trained[0]["generated"], (loaded["generated"], trained[0]["generated"])
    assert len(loaded["generated"][0]) == 4 + 8
    # The whole model came back, not only its argmax: the next-token logits agree (float32, same kernels).
    assert loaded["logits"] == pytest.approx(trained[0]["logits"], rel=1e-5, abs=1e-6)


def test_unsupported_settings_are_refused_by_name(runs):
    refusals = runs["one"]["refusals"]
    assert set(refusals) == {"unknown key", "mismatches", "optimizers", "partial cycle", "not elementwise"}, refusals
    assert all(kind == "ZeroConfigError" for kind, _ in refusals.values()), refusals
    assert "no_such" in refusals["unknown key"][1]
    mismatch = refusals["mismatches"][1]  # both mismatches in one error, as Hugging Face reports them
    assert "gradient_clipping=1.0 vs hf max_grad_norm=0.3" in mismatch and \
        "gradient_accumulation_steps=3 vs hf gradient_accumulation_steps=2" in mismatch, mismatch
    assert "not a multiple of gradient_accumulation_steps (3)" in refusals["partial cycle"][1]
    assert "Adafactor" in refusals["not elementwise"][1]


def test_fill_auto_values_follows_hugging_faces_deepspeed_integration():
    from transformers import TrainingArguments

    from zerocomm.integrations.transformers import fill_auto_values, finalize_auto_values
    from zerocomm.zero import ZeroConfigError

    args = TrainingArguments(output_dir="unused", per_device_train_batch_size=3, gradient_accumulation_steps=4,
                             learning_rate=2e-4, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6, weight_decay=0.1,
                             max_grad_norm=0.5, warmup_steps=0.1, use_cpu=True, report_to=[])
    auto = "auto"
    config = {"train_micro_batch_size_per_gpu": auto, "gradient_accumulation_steps": auto, "train_batch_size": auto,
              "gradient_clipping": auto, "bf16": {"enabled": auto},
              "optimizer": {"type": "AdamW", "params": {"lr": auto, "betas": auto, "eps": auto, "weight_decay": auto}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": auto, "warmup_max_lr": auto,
                                                                "warmup_num_steps": auto, "total_num_steps": auto}}}
    assert fill_auto_values(config, args, world_size=2) == []
    finalize_auto_values(config, args, num_training_steps=50)
    assert config == {
        "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 4, "train_batch_size": 24,
        "gradient_clipping": 0.5, "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-4,
                                                          "warmup_num_steps": 5, "total_num_steps": 50}}}
    # Written values that agree pass; those that do not are all reported in one error, after the schedule's.
    written = {"train_batch_size": 24, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {
        "lr": 2e-4, "betas": (0.8, 0.95), "weight_decay": 0.0}}, "scheduler": {"type": "WarmupLR", "params": {
            "warmup_num_steps": 7}}}
    mismatches = fill_auto_values(written, args, world_size=2)
    assert mismatches == ["- ds gradient_clipping=1.0 vs hf max_grad_norm=0.5",
                          "- ds optimizer.params.weight_decay=0.0 vs hf weight_decay=0.1"]
    with pytest.raises(ZeroConfigError) as raised:
        finalize_auto_values(written, args, num_training_steps=50, mismatches=mismatches)
    lines = [line for line in str(raised.value).splitlines() if line.startswith("- ds")]
    assert lines == mismatches + ["- ds scheduler.params.warmup_num_steps=7 vs hf warmup_steps=5"]
    # A --bf16 run whose config has no bf16 section gets one, as accelerate's DeepSpeed plugin adds it.
    bf16 = TrainingArguments(output_dir="unused", bf16=True, use_cpu=True, report_to=[])
    sections: dict = {}
    assert fill_auto_values(sections, bf16, world_size=1) == [] and sections == {"bf16": {"enabled": True}}


def test_the_module_uses_only_public_zerocomm_names_and_nothing_else_imports_transformers():
    """integrations/transformers.py reaches zerocomm only as ``dist`` (zerocomm.comm) and ``zero`` (zerocomm.zero),
    and every attribute it reads from them is in their ``__all__``; no module of the library outside
    ``integrations/`` imports transformers or accelerate."""
    import ast
    import pathlib

    import zerocomm.comm
    import zerocomm.zero

    root = pathlib.Path(__file__).resolve().parents[2]
    tree = ast.parse((root / "integrations" / "transformers.py").read_text())
    relative = [(node.level, node.module, [a.asname or a.name for a in node.names]) for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level]
    assert relative == [(2, None, ["dist"]), (2, None, ["zero"])], relative
    used = {(node.value.id, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("dist", "zero")}
    private = sorted(f"{module}.{name}" for module, name in used
                     if name not in (zerocomm.comm if module == "dist" else zerocomm.zero).__all__)
    assert not private, f"names outside the public API: {private}"
    importers = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if parts[0] in ("integrations", "tests", "docs", ".venv") or parts[0].startswith("."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name.split(".")[0] in ("transformers", "accelerate") for name in names):
                importers.append(str(path.relative_to(root)))
    assert not importers, importers
    assert '"zerocomm.integrations"' in (root / "pyproject.toml").read_text(), "the package is not in the wheel's list"
