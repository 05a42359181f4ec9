"""``zerocomm-bench cluster --zero``: ZeRO-3 with and without ZeRO++ across the simulated cluster.

The cluster is cluster.py's (hosts as network namespaces, each host's link shaped with ``tbf``).  In it,
every rank trains the ~10 M-parameter TinyLM (``TinyLM.benchmark_size()``, fp32 masters, Adam) with plain
ZeRO-3 and then with ZeRO-3 + qwZ + hpZ (partitions of ``--ranks-per-host``) + qgZ (int4), from the same
initial weights on the same batches, both keeping their gradient bucket buffers from step to step
(``keep_bucket_buffers``).  The batches come from a fixed random bigram table (each next token
follows the table with probability 0.9), so the loss falls and the two runs' losses say something.

Reported per variant:

``step ms``: the median over the steps after the first of the slowest rank's wall time per step
(forward + backward + step, back to back as in training);
``link MiB/step``: bytes that left every host through its link (``eth0`` in ``/proc/net/dev``, summed over
hosts: each byte crossing the link leaves exactly one host), over the timed steps, per step;
``eval@8`` / ``eval@N``: the model's loss on held-out batches (``EVAL_SEQUENCES`` sequences per rank of the
same bigram table, never trained on, the same in both variants) after step 8 and after the last step, averaged
over every rank's tokens: the measure of the two runs' difference (one training batch's loss, ``loss@N``, moves by
more than that difference from step to step);
``loss@8`` / ``loss@N``: the training batch's loss averaged over ranks at step 8 and at the last step;
``CPU ms/step``: processor time of every rank's process (all its threads) per timed step, summed over ranks:
with R ranks sharing C cores, a step cannot take less than this / C;
``faults/step``: minor page faults per timed step, summed over ranks (memory the kernel hands out again: each
costs processor time in the kernel, counted in ``CPU ms/step``).
"""
from __future__ import annotations

import cProfile
import datetime
import json
import os
import resource
import statistics
import sys
import time
from typing import Optional

VARIANTS = ("ZeRO-3", "ZeRO-3 + ZeRO++")
#: Held-out sequences per rank the evaluation loss is measured on (128 tokens each).
EVAL_SEQUENCES = 32


def _link_tx_bytes(interface: str = "eth0") -> int:
    """Bytes this network namespace sent through ``interface`` (0 when there is none)."""
    with open("/proc/self/net/dev") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            if name.strip() == interface:
                return int(rest.split()[8])
    return 0


def _batches(vocab: int, seq_len: int, batch_size: int, rank: int, steps: int, first: int = 0):
    """``steps`` batches of ``(inputs, targets)``, each ``(batch_size, seq_len)`` int64, of this rank's stream
    (``first``: the stream's first batch; held-out batches start far from the trained ones)."""
    import torch

    table = torch.randperm(vocab, generator=torch.Generator().manual_seed(1234))
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(rank * 100_003 + first + step)
        tokens = torch.empty(batch_size, seq_len + 1, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, vocab, (batch_size,), generator=g)
        noise = torch.randint(0, vocab, (batch_size, seq_len), generator=g)
        keep = torch.rand(batch_size, seq_len, generator=g) < 0.9
        for t in range(seq_len):
            tokens[:, t + 1] = torch.where(keep[:, t], table[tokens[:, t]], noise[:, t])
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def rank_main(job_env: str) -> int:
    """One rank (started by cluster.py's agent with the job in the environment variable ``job_env``)."""
    import torch

    import zerocomm.comm as dist
    from zerocomm.benchmarks.models import TinyLM, loss_fn
    from zerocomm.zero import ZeroConfig, initialize

    torch.set_num_threads(1)
    job = json.loads(os.environ[job_env])
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=job["timeout_s"]))
    rank, n = dist.get_rank(), dist.get_world_size()
    per_host = job["ranks_per_host"]
    shape = TinyLM.benchmark_size()
    steps = job["zero_steps"]
    batches = _batches(shape.vocab, shape.seq_len, job["batch"], rank, steps)
    held_out = _batches(shape.vocab, shape.seq_len, EVAL_SEQUENCES, rank, 1, first=50_000)[0]
    evaluate_after = {min(8, steps) - 1, steps - 1}
    zeropp = {"zero_quantized_weights": True, "zero_hpz_partition_size": per_host,
              "zero_quantized_gradients": True, "quantized_gradient_bits": job["bits"]}
    rows = []
    try:
        for variant in VARIANTS:
            torch.manual_seed(0)
            model = TinyLM(shape)
            # Both variants keep their bucket buffers between steps, as DeepSpeed keeps its reduction buffers:
            # freed, glibc hands them back to the kernel and every backward faults them in again.
            config = ZeroConfig(stage=3, keep_bucket_buffers=True, **(zeropp if variant != VARIANTS[0] else {}))
            model, optimizer = initialize(model, lambda params: torch.optim.Adam(params, lr=job["lr"]), config)
            times, cpu, faults, losses, evals = [], [], [], [], []
            tx_before, tx_eval = None, 0
            profiler = None
            dist.barrier(algorithm="native")
            for step, (x, y) in enumerate(batches):
                if step == 1:
                    dist.barrier(algorithm="native")
                    tx_before = _link_tx_bytes()
                    if job.get("profile") and rank == 0:
                        profiler = cProfile.Profile()
                        profiler.enable()
                start, cpu_start = time.perf_counter(), time.process_time()
                faults_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                loss = loss_fn(model, model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step == steps - 1:
                    optimizer.synchronize()
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - cpu_start)
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_start)
                losses.append(loss.item())
                if step in evaluate_after:  # not timed; its link bytes are left out of the count
                    tx_start = _link_tx_bytes() if tx_before is not None else 0
                    evals.append(_evaluate(model, held_out, loss_fn, dist))
                    tx_eval += _link_tx_bytes() - tx_start if tx_before is not None else 0
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(f"{job['profile']}.{VARIANTS.index(variant)}")
            dist.barrier(algorithm="native")
            tx = _link_tx_bytes() - tx_before - tx_eval
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, dist.ReduceOp.MAX, algorithm="native")
            mean_loss = torch.tensor(losses, dtype=torch.float64)
            dist.all_reduce(mean_loss, dist.ReduceOp.AVG, algorithm="native")
            cpu_total = torch.tensor([sum(cpu[1:]) / max(steps - 1, 1), sum(faults[1:]) / max(steps - 1, 1)],
                                     dtype=torch.float64)
            dist.all_reduce(cpu_total, dist.ReduceOp.SUM, algorithm="native")
            every_tx = [None] * n
            dist.all_gather_object(every_tx, tx)
            link = sum(every_tx[r] for r in range(0, n, per_host))  # one reading per host
            rows.append({"variant": variant, "step_s": statistics.median(slowest.tolist()[1:]),
                         "link_bytes_per_step": link / (steps - 1), "losses": mean_loss.tolist(),
                         "eval_losses": evals,
                         "cpu_s": cpu_total[0].item(), "page_faults": cpu_total[1].item(),
                         "state_bytes": optimizer.model_state_bytes()})
            optimizer.remove_hooks()
            del model, optimizer
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(job["out"], "w") as handle:
            json.dump({"rows": rows}, handle)
    return 0


def _evaluate(model, held_out, loss_fn, dist) -> float:
    """The model's mean loss over every rank's held-out tokens (every rank calls it; a forward under no_grad)."""
    import torch

    x, y = held_out
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = loss_fn(model, model(x), y).double().reshape(1)
    model.train(was_training)
    dist.all_reduce(loss, dist.ReduceOp.AVG, algorithm="native")  # every rank holds as many tokens
    return loss.item()


def job(*, steps: int, batch: int, bits: int, lr: float, job_env: str, profile: Optional[str] = None) -> dict:
    """What cluster.py's ranks run for ``--zero``: this module's ``rank_main``, reading the job from ``job_env``.
    ``profile``: rank 0 writes cProfile statistics of each variant's timed steps to ``profile.0``, ``profile.1``."""
    return {"zero_steps": steps, "batch": batch, "bits": bits, "lr": lr, "profile": profile,
            "rank_command": [sys.executable, "-m", __name__, "--rank", job_env]}


def result(job: dict, measured: dict, load_before, load_after, *, hosts: int, ranks_per_host: int,
           rate_bits: int) -> dict:
    """The run's setup, load and rows (what ``format_table`` prints and ``--json`` keeps)."""
    return {"hosts": hosts, "ranks_per_host": ranks_per_host, "rate_bits": rate_bits, "steps": job["zero_steps"],
            "batch": job["batch"], "bits": job["bits"], "lr": job["lr"], "load_before": load_before,
            "load_after": load_after, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "rows": measured["rows"]}


def format_table(result: dict) -> str:
    steps = result["steps"]
    lines = [f"# ZeRO-3 across {result['hosts']} hosts x {result['ranks_per_host']} ranks, gloo, each link "
             f"{result['rate_bits'] / 1e9:g} Gbit/s each way; TinyLM ~10 M parameters, fp32, Adam lr {result['lr']}, "
             f"batch {result['batch']} x 128 tokens per rank, {steps} steps; ZeRO++ = qwZ int8 + hpZ "
             f"(partition {result['ranks_per_host']}) + qgZ int{result['bits']}; load "
             f"{' '.join(f'{x:.2f}' for x in result['load_before'])} (before), "
             f"{' '.join(f'{x:.2f}' for x in result['load_after'])} (after)",
             f"# {'variant':>16} {'step ms':>9} {'speedup':>8} {'link MiB/step':>14} {'vs plain':>9} "
             f"{f'eval@{min(8, steps)}':>8} {f'eval@{steps}':>9} "
             f"{f'loss@{min(8, steps)}':>8} {f'loss@{steps}':>9} {'CPU ms/step':>12} {'faults/step':>12}"]
    base = result["rows"][0]
    for row in result["rows"]:
        at8 = row["losses"][min(8, steps) - 1]
        evals = row.get("eval_losses") or [float("nan")]  # rows written before the column have none
        lines.append(f"  {row['variant']:>16} {row['step_s'] * 1e3:>9.0f} {base['step_s'] / row['step_s']:>7.2f}x "
                     f"{row['link_bytes_per_step'] / 2**20:>14.1f} "
                     f"{base['link_bytes_per_step'] / max(row['link_bytes_per_step'], 1):>8.2f}x "
                     f"{evals[0]:>8.4f} {evals[-1]:>9.4f} "
                     f"{at8:>8.4f} {row['losses'][-1]:>9.4f} {row['cpu_s'] * 1e3 if 'cpu_s' in row else float('nan'):>12.0f} "
                     f"{row.get('page_faults', float('nan')):>12.0f}")
    plain_eval, pp_eval = result["rows"][0].get("eval_losses"), result["rows"][-1].get("eval_losses")
    if plain_eval and pp_eval:
        lines.append(f"# held-out loss difference (ZeRO++ vs plain, relative): after step {min(8, steps)} "
                     f"{abs(pp_eval[0] / plain_eval[0] - 1):.2%}, after step {steps} "
                     f"{abs(pp_eval[-1] / plain_eval[-1] - 1):.2%}")
    plain, pp = result["rows"][0]["losses"], result["rows"][-1]["losses"]
    line = (f"# training-batch loss difference (ZeRO++ vs plain, relative): step {min(8, steps)} "
            f"{abs(pp[min(8, steps) - 1] / plain[min(8, steps) - 1] - 1):.2%}, step {steps} {abs(pp[-1] / plain[-1] - 1):.2%}")
    if steps >= 20:  # one step's loss is one batch's: the mean of the last ten says more about where training is
        last = slice(steps - 10, steps)
        line += (f", mean of steps {steps - 9}-{steps} "
                 f"{abs(sum(pp[last]) / sum(plain[last]) - 1):.2%}")
    lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        sys.exit(rank_main(sys.argv[2]))
    sys.exit("run through zerocomm-bench cluster --zero")
