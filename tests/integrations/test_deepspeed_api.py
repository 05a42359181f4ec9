"""``import zerocomm.deepspeed as deepspeed`` runs a DeepSpeed training script with that one line changed.

Ranks start under torchrun, as users start them.  Three launches (each runs several scripts in one
process, see scripts/run_scripts.py, to pay for ``import torch`` once):

1. the getting-started script (scripts/ds_getting_started.py, ``import deepspeed`` replaced) at stages 2 and
   3 with gradient accumulation 2, saving a checkpoint half way; and the same loop written with
   ``zerocomm.zero.initialize`` (scripts/zero_loop.py): the losses must be equal, step for step;
2. the script again, resuming from those checkpoints: its losses must equal the uninterrupted run's, and
   ``client_state`` comes back; and scripts/ds_variants.py (a torch optimizer object, ``collate_fn``, a
   scheduler passed in, explicit checkpoint tags);
3. scripts/zero_init.py: a model built under ``deepspeed.zero.Init`` (allocations counted by torch's profiler),
   trained against the same model built normally; ``GatheredParameters``; refusals that need ranks.

A ``deepspeed`` package that raises on import is put first on ``PYTHONPATH``: the scripts never import it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from support.launchers import clean_env, launch, tool

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ROOT = Path(__file__).resolve().parents[2]
ORIGINAL_IMPORT = "import deepspeed\n"
CHANGED_IMPORT = "import zerocomm.deepspeed as deepspeed\n"
SAVE_AT = 8  # micro-steps: 4 optimizer steps of the 8 in a run (2 epochs x 8 micro-batches, accumulation 2)

pytestmark = pytest.mark.timeout(400)


def _config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                          "warmup_num_steps": 4}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 100}}


def _env(tmp: Path) -> dict:
    poison = tmp / "poison" / "deepspeed"
    poison.mkdir(parents=True, exist_ok=True)
    (poison / "__init__.py").write_text("raise ImportError('the real deepspeed package was imported')\n")
    return clean_env(PYTHONPATH=f"{poison.parent}")


def _torchrun(tmp: Path, plan: list) -> None:
    (tmp / "plan.json").write_text(json.dumps(plan))
    done = launch([tool("torchrun"), "--standalone", "--nproc-per-node", "2", str(SCRIPTS / "run_scripts.py"),
                   str(tmp / "plan.json")], tmp, env=_env(tmp))
    assert done.returncode == 0, done.stdout[-6000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Launches 1 and 2: {"ds2", "ds3", "ref2", "ref3", "resume2", "resume3", "variants"} -> the rank-0 report."""
    tmp = tmp_path_factory.mktemp("deepspeed_api")
    script = (SCRIPTS / "ds_getting_started.py").read_text()
    assert script.count(ORIGINAL_IMPORT) == 1
    changed = tmp / "train.py"
    changed.write_text(script.replace(ORIGINAL_IMPORT, CHANGED_IMPORT))
    first, second = [], []
    for stage in (2, 3):
        (tmp / f"ds{stage}.json").write_text(json.dumps(_config(stage)))
        ds_args = ["--deepspeed", "--deepspeed_config", str(tmp / f"ds{stage}.json")]
        first.append([str(changed), *ds_args, "--out", str(tmp / f"ds{stage}.out"),
                      "--save_dir", str(tmp / f"ckpt{stage}"), "--save_at", str(SAVE_AT)])
        first.append([str(SCRIPTS / "zero_loop.py"), str(tmp / f"ds{stage}.json"), str(tmp / f"ref{stage}.out")])
        second.append([str(changed), *ds_args, "--out", str(tmp / f"resume{stage}.out"),
                       "--load_dir", str(tmp / f"ckpt{stage}")])
    second.append([str(SCRIPTS / "ds_variants.py"), str(tmp / "ds3.json"), str(tmp / "variants.out"),
                   str(tmp / "ckpt-tags")])
    _torchrun(tmp, first)
    _torchrun(tmp, second)
    out = {name: json.loads((tmp / f"{name}.out").read_text())
           for name in ("ds2", "ds3", "ref2", "ref3", "resume2", "resume3", "variants")}
    out["tmp"] = tmp
    return out


def test_the_script_differs_from_deepspeeds_by_its_import_line():
    original = (SCRIPTS / "ds_getting_started.py").read_text().splitlines(keepends=True)
    changed = "".join(original).replace(ORIGINAL_IMPORT, CHANGED_IMPORT).splitlines(keepends=True)
    differing = [(a, b) for a, b in zip(original, changed) if a != b]
    assert len(original) == len(changed) and differing == [(ORIGINAL_IMPORT, CHANGED_IMPORT)]


@pytest.mark.parametrize("stage", [2, 3])
def test_getting_started_script_matches_the_zero_initialize_loop(runs, stage):
    """Same losses, step for step, as the loop written with zerocomm.zero (whose users call loss.backward()
    unscaled): so engine.backward's accumulation scaling, step's boundary and the dataloader are DeepSpeed's."""
    ds, ref = runs[f"ds{stage}"], runs[f"ref{stage}"]
    assert len(ds["losses"]) == 16 and ds["losses"] == ref["losses"], (ds["losses"], ref["losses"])
    assert ds["global_steps"] == ref["global_steps"] == 8
    assert ds["micro"] == 8 and ds["accumulation"] == 2
    assert ds["modules"] == [], f"the real deepspeed was imported: {ds['modules']}"
    assert sum(ds["losses"][8:]) < sum(ds["losses"][:8]), "the second epoch's loss is not below the first's"


@pytest.mark.parametrize("stage", [2, 3])
def test_resume_from_save_checkpoint_equals_the_uninterrupted_run(runs, stage):
    whole, resumed = runs[f"ds{stage}"], runs[f"resume{stage}"]
    assert resumed["losses"] == whole["losses"][SAVE_AT:], (resumed["losses"], whole["losses"][SAVE_AT:])
    assert resumed["global_steps"] == whole["global_steps"]
    assert resumed["client_state"] == {"step": SAVE_AT, "note": {"epoch": 0, "lr": whole["client_state"]["note"]["lr"]}}
    ckpt = runs["tmp"] / f"ckpt{stage}"
    assert (ckpt / "latest").read_text() == f"global_step{SAVE_AT // 2}"  # DeepSpeed's default tag and latest file
    assert (ckpt / f"global_step{SAVE_AT // 2}").is_dir()


def test_initialize_argument_forms(runs):
    """A torch AdamW built over the model's parameters trains exactly as the config's AdamW section; a scheduler
    passed as a callable is the engine's and is stepped once per optimizer step (StepLR, gamma 0.5: lr 0.01 x
    0.5^4 after 4 steps); explicit tags load by name, ``save_latest=False`` leaves ``latest`` alone, and a folder
    without ``latest`` gives (None, None)."""
    v = runs["variants"]
    assert v["torch_optimizer_losses"] == runs["ds3"]["losses"]
    assert v["optimizer_class"] == "AdamW" and v["collate_calls"] == [8]
    assert v["step_lr"] == {"lr": [0.01 * 0.5 ** 4], "global_steps": 4, "is_engine_scheduler": True, "last_epoch": 4}
    assert v["load_latest"] == {"client_state": {"k": [1, 2]}, "global_steps": 4, "lr": [0.01 * 0.5 ** 4]}
    assert v["load_tag"] == {"client_state": {"k": "other"}}
    assert v["load_missing"] == [None, None]
    # the update is the mean gradient of the cycle's micro-batches over the ranks (a sum would be 2x, 4x off)
    assert v["sgd_step_max_error"] <= 1e-6 < v["sgd_step_size"] / 10, v


@pytest.fixture(scope="module")
def init_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deepspeed_init")
    _torchrun(tmp, [[str(SCRIPTS / "zero_init.py"), str(tmp / "init.out"), str(tmp / "ckpt")]])
    return json.loads((tmp / "init.out").read_text())


def test_zero_init_builds_the_model_sharded_and_initialize_never_gathers_it(init_report):
    """Allocations counted by torch's profiler on rank 0 (bytes).  Built under Init, a rank holds 1/N of the
    model plus the module being built; ``initialize`` moves the chunks into ZeRO's shards one unit at a time and
    never holds more than it ends with (1/N of the parameters and the 1/N gradient shard stage 3 keeps) plus
    about two units.  Built normally, the model is whole on every rank and ``initialize`` flattens it again."""
    r = init_report
    n, total, unit = r["world"], r["total_bytes"], r["unit_bytes"]
    init, plain = r["init_bytes"], r["plain_bytes"]
    slack = 1 << 20
    assert plain["build"] >= total and plain["initialize"] >= 2 * total, plain  # the measurement sees the model
    assert abs(init["held"] - total / n) <= slack, init  # each rank keeps its chunk of every parameter
    assert init["build"] <= total / n + 2 * unit + slack, init
    assert abs(init["end"] - 2 * total / n) <= slack, init  # parameter shard + gradient shard, float32
    assert init["initialize"] <= init["end"] + 2 * unit + slack, init
    assert init["initialize"] < plain["initialize"] / 2, (init, plain)


def test_zero_init_model_trains_as_the_ordinary_one(init_report):
    r = init_report
    assert r["stage3_init_losses"] == r["stage3_plain_losses"]
    assert r["stage3_params_equal"], r["stage3_param_max_diff"]
    assert r["stage2_init_losses"] == r["stage2_plain_losses"]  # stage 2 gathers Init's parameters whole
    assert r["bf16_init_losses"] == r["bf16_plain_losses"] and r["bf16_masters_equal"]
    init_losses, plain_losses = r["bf16_after_load_losses"]  # the ordinary engine's checkpoint, loaded into Init's
    assert r["bf16_loaded_masters_equal"] and init_losses == plain_losses


def test_gathered_parameters(init_report):
    assert init_report["subset_gather_equal"]  # one unit gathered alone equals the whole-model gather
    assert init_report["modifier_rank_1_bias"] == [2.0]  # rank 1 wrote rank + 1: every rank has it


def test_refusals_that_need_ranks(init_report):
    refusals = init_report["refusals"]
    assert "amp" in refusals["amp"]
    assert "load_module_only" in refusals["load_module_only"]
    assert "lr_scheduler" in refusals["lr_scheduler"] and "scheduler section" in refusals["lr_scheduler"]


# -- in this process: nothing here joins a process group -------------------------------------------------
def test_add_config_arguments():
    import zerocomm.deepspeed as deepspeed

    parser = argparse.ArgumentParser()
    assert deepspeed.add_config_arguments(parser) is parser
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed is True and args.deepspeed_config == "ds.json"
    assert parser.parse_args([]).deepspeed is False


def test_refusals_by_name():
    import torch

    import zerocomm.comm as dist
    import zerocomm.deepspeed as deepspeed
    from zerocomm.zero import ZeroConfigError

    assert not dist.is_initialized()
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ZeroConfigError, match="mpu"):
        deepspeed.initialize(model=model, config={"train_batch_size": 2}, mpu=object())
    with pytest.raises(ZeroConfigError, match="mesh_param"):
        deepspeed.initialize(model=model, config={"train_batch_size": 2}, mesh_param=(1, 2))
    with pytest.raises(ZeroConfigError, match="dist_init_required=False"):
        deepspeed.initialize(model=model, config={"train_batch_size": 2}, dist_init_required=False)
    with pytest.raises(ZeroConfigError, match="args.deepspeed_config"):
        deepspeed.initialize(args=argparse.Namespace(deepspeed_config="a.json"), model=model, config={})
    with pytest.raises(ZeroConfigError, match="remote_device"):
        deepspeed.zero.Init(remote_device="nvme")
    with pytest.raises(ZeroConfigError, match="dtype"):
        deepspeed.zero.Init(dtype=torch.float16)
    with pytest.raises(ZeroConfigError, match="pipeline"):
        deepspeed.PipelineModule(layers=[])
    with pytest.raises(dist.NotInitializedError):
        with deepspeed.zero.Init():
            pass
    assert "__init_subclass__" not in torch.nn.Module.__dict__  # nothing was left patched


def test_the_package_imports_no_deepspeed():
    import subprocess

    code = ("import sys, zerocomm.deepspeed as ds; ds.zero.Init; ds.zero.GatheredParameters; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'deepspeed'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


# -- the page --------------------------------------------------------------------------------------------------
PAGE = ROOT / "docs" / "integrations" / "deepspeed.md"


def _block(marker: str) -> str:
    import re

    match = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", PAGE.read_text(), re.S)
    assert match, f"{PAGE.name} has no python block after <!-- {marker} -->"
    return match.group(1)


def test_page_shows_the_tested_script_before_and_after():
    """The page's "before" is the script the tests run (without its docstring), and "after" differs from it by the
    import line alone."""
    script = (SCRIPTS / "ds_getting_started.py").read_text()
    body = script[script.index('"""\n', 3) + 4:].lstrip("\n")
    assert _block("deepspeed-before") == body
    assert _block("deepspeed-after") == body.replace(ORIGINAL_IMPORT, CHANGED_IMPORT)


def test_page_links_resolve():
    import re

    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", PAGE.read_text())
    assert targets and all((PAGE.parent / t).exists() for t in targets if "://" not in t), targets
