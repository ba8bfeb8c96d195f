"""train.py end to end as users run it: real torchrun processes (gloo over loopback), tiny jobs on `shapes`."""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from src.engine.checkpoint.files import load_checkpoint
from src.errors import USER_ERROR_EXIT_CODE

from tests.support.launch import TINY, launch, rows


def syncbn_on_two_vs_bn_on_one(tmp_path: Path, common: list[str], batch: int) -> tuple[Path, Path]:
    """Run `common` as 2 processes x batch with norm=syncbn and as 1 process x 2*batch with norm=bn."""
    two, one = tmp_path / "two", tmp_path / "one"
    a = launch(2, [*common, "norm=syncbn", f"data.batch_size={batch}", f"hydra.run.dir={two}"])
    assert a.returncode == 0, a.stdout[-4000:]
    b = launch(0, [*common, "norm=bn", f"data.batch_size={2 * batch}", f"hydra.run.dir={one}"])
    assert b.returncode == 0, b.stdout[-4000:]
    return two, one


@pytest.mark.slow  # torchrun on 2 processes
def test_bad_config_fails_on_every_rank_before_any_process_group(tmp_path: Path) -> None:
    """A user's mistake under torchrun, as users run it (no HYDRA_FULL_ERROR): every rank stops with exit code 2
    before any process group or run dir, and our processes print the one message once, nothing else (their
    output is read from torchrun's per-rank log files; torchrun's own failure report is beside it)."""
    started = time.monotonic()
    logs = tmp_path / "logs"
    result = launch(2, [*TINY, "trainer.grad_accum_steps=0", f"hydra.run.dir={tmp_path / 'run'}"], timeout=180,
                    full_error=False, torchrun_args=("--redirects=3", f"--log-dir={logs}"))
    assert result.returncode != 0
    assert time.monotonic() - started < 180
    assert not (tmp_path / "run" / "logs").exists()  # failed in validation, before init_distributed and the run dir
    printed = {(f.parent.name, f.name): f.read_text() for f in logs.rglob("attempt_0/*/std*.log")}
    assert printed == {("0", "stdout.log"): "", ("1", "stdout.log"): "", ("1", "stderr.log"): "",
                       ("0", "stderr.log"): f"error: trainer.grad_accum_steps must be > 0, got 0\n"}, printed
    # The first worker to end exited with the documented code (torchrun may stop the other before it ends), and
    # a mistake leaves no traceback in torchrun's error file.
    summary = result.stdout[result.stdout.index("Root Cause"):]
    assert f"exitcode  : {USER_ERROR_EXIT_CODE} " in summary and "error_file: <N/A>" in summary, summary


@pytest.mark.slow
def test_two_process_syncbn_run_with_accumulation_checkpoints_and_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = [*TINY, "norm=syncbn", "data.batch_size=4", "trainer.grad_accum_steps=2", "trainer.epochs=2",
           "trainer.log_every=2", "trainer.checkpoint_every=5", "trainer.keep_best=1",
           f"hydra.run.dir={run_dir}"]
    first = launch(2, job)
    assert first.returncode == 0, first.stdout[-4000:]
    assert f"TensorBoard logs are in {run_dir / 'tensorboard'}" in first.stdout
    # The run's summary (src/commands/run_summary.py), once: the best checkpoint it names is there.
    assert first.stdout.count("run finished in ") == 1 and "24 optimizer steps, 2 epoch(s)" in first.stdout
    best = next(line for line in first.stdout.splitlines() if line.startswith("  best top1 "))
    assert Path(best.rsplit(": ", 1)[1]).is_file() and f"evaluate.py ckpt={run_dir}/checkpoints/best_" in first.stdout
    # One run dir: Hydra's config once (rank 0), a log per rank, events and checkpoints from rank 0.
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", "checkpoints", "logs", "metrics.jsonl",
                                                          "tensorboard"]
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    assert len(list((run_dir / "tensorboard").iterdir())) == 1
    train, val = rows(run_dir, "train"), rows(run_dir, "val")
    # 192 / (2 x 4) = 24 micro-batches = 12 optimizer steps per epoch with K=2.
    assert [r["step"] for r in train] == list(range(2, 25, 2))
    assert all({"loss", "lr", "throughput"} <= r.keys() for r in train)
    assert [(r["epoch"], r["step"]) for r in val] == [(0, 12), (1, 24)]
    assert all(0 <= r["top1"] <= 100 and "top5" in r for r in val)
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert (last["epoch"], last["step"], last["sampler"]["micro_batch"]) == (2, 24, 0)
    assert len(last["rng"]) == 2 and last["config"]["norm"]["name"] == "syncbn"
    assert len([p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("best")]) == 1

    # resume=auto in the same run dir continues at epoch 2, step 24 instead of starting over.
    second = launch(2, [*job, "trainer.epochs=3", "trainer.resume=auto"])
    assert second.returncode == 0, second.stdout[-4000:]
    assert "resumed from" in second.stdout
    val = rows(run_dir, "val")
    assert [(r["epoch"], r["step"]) for r in val] == [(0, 12), (1, 24), (2, 36)]
    assert [r["step"] for r in rows(run_dir, "train")][-6:] == list(range(26, 37, 2))


EARLIER_RUN = "2020-01-01_00-00-00"  # a run dir Hydra's default pattern (outputs/<date_time>) made earlier


@pytest.fixture(scope="module")
def default_dir_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """One 1-process launch that two tests read: trainer.resume=auto without hydra.run.dir, from a folder whose
    outputs/ already holds an earlier run with a checkpoint; eval_every=2, keep_best=2 over 4 epochs of 4 steps.
    Returns the result, the outputs/ folder and the new run's dir."""
    root = tmp_path_factory.mktemp("default_dir")
    earlier = root / "outputs" / EARLIER_RUN
    (earlier / "checkpoints").mkdir(parents=True)
    (earlier / "checkpoints" / "last.pt").touch()  # only its existence matters: nothing is loaded
    job = [*TINY, "norm=bn", "data.train_size=64", "data.batch_size=16", "trainer.epochs=4", "trainer.eval_every=2",
           "trainer.keep_best=2", "trainer.tensorboard=false", "trainer.resume=auto"]
    result = launch(0, job, cwd=root)  # default run dir: outputs/<date_time> under root
    assert result.returncode == 0, result.stdout[-4000:]
    (run_dir,) = [p for p in (root / "outputs").iterdir() if p.name != EARLIER_RUN]
    return result, root / "outputs", run_dir


def test_best_checkpoints_hold_only_evaluated_weights_with_their_metrics(default_dir_run: tuple) -> None:
    """eval_every=2, keep_best=2 over 4 epochs: best files only at the evaluated steps, each with the metrics of
    that evaluation (unevaluated epochs once saved the previous evaluation's metrics under a later step)."""
    _, _, run_dir = default_dir_run
    val = {r["step"]: r for r in rows(run_dir, "val")}
    assert sorted(val) == [8, 16]  # 4 steps per epoch; epochs 1 and 3 (0-based) end evaluated
    best = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("best"))
    assert [load_checkpoint(p)["step"] for p in best] == [8, 16]
    for path in best:
        ckpt = load_checkpoint(path)
        logged = val[ckpt["step"]]
        assert set(ckpt["metrics"]) == {"loss", "top1", "top5"}
        assert all(ckpt["metrics"][k] == logged[k] for k in ckpt["metrics"])
        assert f"top1{logged['top1']:.4f}" in path.name
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert last["step"] == 16 and last["metrics"]["top1"] == val[16]["top1"]
    ranked = sorted(([val[s]["top1"], p.name] for s, p in zip((8, 16), best)), key=lambda b: -b[0])
    assert last["best"] == ranked


def test_resume_auto_in_a_fresh_default_run_dir_says_it_starts_over_and_how_to_resume(default_dir_run: tuple) -> None:
    """resume=auto without hydra.run.dir gets a new timestamped dir, which never holds a checkpoint: the run
    says so loudly and names the newest earlier run with a checkpoint, instead of silently starting over."""
    result, outputs, _ = default_dir_run
    assert "WARNING" in result.stdout and "STARTS FROM SCRATCH" in result.stdout
    assert "trainer.resume=<run folder>" in result.stdout
    assert f"The newest earlier run with a checkpoint is {outputs / EARLIER_RUN}: trainer.resume=" in result.stdout
    assert len(list(outputs.iterdir())) == 2  # the new run went to its own dir


@pytest.mark.slow  # torchrun on 2 processes
def test_a_diverging_run_stops_on_every_rank_and_keeps_the_last_finite_checkpoint(tmp_path: Path) -> None:
    """optim.lr=1e6 on 2 processes: a non-zero exit, every rank raising the error that names the step and the
    usual causes (none left waiting in a collective), and last.pt still finite."""
    run_dir = tmp_path / "run"
    job = [*TINY, "norm=bn", "data.train_size=64", "data.image_size=8", "data.batch_size=4", "trainer.epochs=2",
           "optim.lr=1e6", "trainer.checkpoint_every=1", "trainer.log_every=2", "trainer.tensorboard=false",
           "trainer.dist_timeout_s=120", f"hydra.run.dir={run_dir}"]
    result = launch(2, job)
    assert result.returncode != 0
    for rank in (0, 1):  # each rank raised by itself (torchrun would otherwise have killed a waiting one)
        assert re.search(rf"\[rank{rank}\]: src\.engine\.finite\.NonFiniteError: training diverged: .* at (optimizer )?"
                         r"step \d+.*Usual causes: a learning rate too high", result.stdout), result.stdout[-4000:]
    assert "timed out" not in result.stdout.lower()
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert all(bool(torch.isfinite(v).all()) for v in last["model"].values() if v.is_floating_point())
    assert last["step"] >= 1


@pytest.mark.slow
def test_float64_two_process_syncbn_equals_one_process_bn_for_50_steps(tmp_path: Path) -> None:
    """trainer.dtype=float64: W=2 x b=4 with norm=syncbn == W=1 x b=8 with norm=bn, 50 optimizer steps.

    In float64 the two runs differ only by float64 rounding of sums taken in another order (Chan merge of
    two halves, DDP's two-way gradient average): ~1e-16 relative per operation, which 50 steps of training
    amplify to a measured worst of 4e-12 (losses) and 2e-11 (parameters and BN statistics, relative to
    each tensor's largest value; AMD EPYC, 2026-12-01). Bound: 1e-9. The bug this guards against,
    per-rank BN (norm=bn on the 2 processes), differs by 3e-3 at step 1 and by up to 1.0 over the run.
    """
    common = [*TINY, "data.train_size=400", "data.val_size=16", "data.image_size=8", "trainer.epochs=1",
              "trainer.log_every=1", "trainer.tensorboard=false", "sched.warmup_epochs=0", "trainer.dtype=float64",
              # SGD at lr 0.1 with plain momentum, as measured: a larger step amplifies rounding more
              "optim.lr=0.1", "optim.reference_batch_size=null", "optim.nesterov=false"]
    two, one = syncbn_on_two_vs_bn_on_one(tmp_path, common, batch=4)
    losses_two = [r["loss"] for r in rows(two, "train")]
    losses_one = [r["loss"] for r in rows(one, "train")]
    assert len(losses_two) == len(losses_one) == 50
    worst_loss = max(abs(x - y) / abs(y) for x, y in zip(losses_two, losses_one))
    assert worst_loss < 1e-9, f"per-step losses differ by up to {worst_loss:.3g} relative"

    p_two = load_checkpoint(two / "checkpoints" / "last.pt")["model"]
    p_one = load_checkpoint(one / "checkpoints" / "last.pt")["model"]
    assert p_two.keys() == p_one.keys() and all(v.dtype == torch.float64 for v in p_one.values()
                                                if v.is_floating_point())
    worst_param = max(((p_two[k] - p_one[k]).abs().max() / p_one[k].abs().max()).item()
                      for k in p_one if p_one[k].is_floating_point() and p_one[k].abs().max() > 0)
    assert worst_param < 1e-9, f"final parameters and BN statistics differ by up to {worst_param:.3g} relative"
    assert all(torch.equal(p_two[k], p_one[k]) for k in p_one if not p_one[k].is_floating_point())


@pytest.mark.slow
def test_two_processes_syncbn_reproduce_one_process_bn_step_by_step(tmp_path: Path) -> None:
    """W=2 x b=16 with norm=syncbn == W=1 x b=32 with norm=bn: same per-step losses and final parameters.

    The samplers give the same global batches, augmentation depends on (seed, epoch, index) only, SyncBN
    normalises with the statistics of the concatenated batch, and DDP averages the two half-batch mean
    gradients into the full-batch mean gradient. What differs is fp32 summation order (Chan merge of two
    halves vs one pass, a two-way gradient average vs one reduction): ~1e-7 relative per operation.
    Measured (2026-11-29): step 1 (same weights, same batch: forward rounding only) agrees to 6e-8.
    Later steps drift, because training itself amplifies rounding ~10-30x per step (the same W=2 vs W=1
    comparison with norm=gn, which involves no SyncBN and no cross-sample statistics, grows from 6e-8 to
    2e-4 by step 7); with the SyncBN kernels of 14:20 the gap was 2e-6 / 8e-5 / 3e-4 at steps 2-4. So the
    run is kept to 4 steps and the bounds are: step 1 < 1e-5; steps 2-4 < 2e-3; parameters < 2e-3
    absolute (measured 4e-4), BN running stats < 1e-2 relative (measured 7e-4). The bug this guards
    against, per-rank BN (norm=bn on 2 processes), differs by 1.3e-2 / 2.6e-2 / 1e-2 at steps 1-3.
    """
    common = [*TINY, "data.train_size=128", "trainer.deterministic=true", "trainer.epochs=1",
              "trainer.log_every=1", "trainer.tensorboard=false", "optim.lr=0.02", "sched.warmup_epochs=0"]
    two, one = syncbn_on_two_vs_bn_on_one(tmp_path, common, batch=16)

    losses_two = [r["loss"] for r in rows(two, "train")]
    losses_one = [r["loss"] for r in rows(one, "train")]
    assert len(losses_two) == len(losses_one) == 4
    assert [r["lr"] for r in rows(two, "train")] == pytest.approx([r["lr"] for r in rows(one, "train")])
    assert abs(losses_two[0] - losses_one[0]) < 1e-5, f"step 1 losses: {losses_two[0]} vs {losses_one[0]}"
    worst_loss = max(abs(x - y) for x, y in zip(losses_two, losses_one))
    assert worst_loss < 2e-3, f"per-step losses differ by up to {worst_loss}"

    p_two = load_checkpoint(two / "checkpoints" / "last.pt")["model"]
    p_one = load_checkpoint(one / "checkpoints" / "last.pt")["model"]
    assert p_two.keys() == p_one.keys()
    floats = [k for k in p_one if p_one[k].is_floating_point()]
    worst_param = max((p_two[k].double() - p_one[k].double()).abs().max().item()
                      for k in floats if "running" not in k)
    assert worst_param < 2e-3, f"final parameters differ by up to {worst_param}"
    worst_stat = max(((p_two[k].double() - p_one[k].double()).abs().max() / p_one[k].double().abs().max()).item()
                     for k in floats if "running" in k)
    assert worst_stat < 1e-2, f"BN running statistics differ by up to {worst_stat} (relative)"
