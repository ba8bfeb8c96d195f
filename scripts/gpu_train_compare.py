"""A few training steps with norm=syncbn (our CUDA kernels) and norm=torch_syncbn (nn.SyncBatchNorm) in
float64 on GPUs over NCCL, compared step by step: train losses and the final parameters. Run by
scripts/gpu_check.sh (`make gpu-check`).

    python scripts/gpu_train_compare.py OUT_DIR [--steps 6] [--nproc 2] [--timeout 45]

Two processes need two GPUs (NCCL refuses two ranks on one GPU); with one GPU visible the compare runs one
process, and the JSON says so. In float64 both norms compute the same statistics up to summation order,
so the losses agree to ~1e-12 relative per step; the check allows 1e-9 (loss) and 1e-7 (parameters, after
SGD steps that amplify differences a little) and reports the measured differences.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
LOSS_RTOL = 1e-9
PARAM_ATOL = 1e-7


def child_env() -> dict[str, str]:
    """This environment with the repository put in front of PYTHONPATH, which is kept: on a GPU node it also
    names the folder scripts/gpu_check.sh installed the carried wheels (Hydra) into."""
    path = [str(REPO), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def run_training(norm: str, run_dir: Path, steps: int, nproc: int, timeout_s: float) -> int | str:
    """train.py under torchrun with `norm`, float64, deterministic, logging every step: its exit status, or
    "timed out" when it ran past `timeout_s` (it is killed then; its log says how far it got)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py",
           f"norm={norm}", "model=resnet20", "data=shapes", "data.train_size=256", "data.val_size=64",
           "data.batch_size=16", "optim.lr=0.1", "optim.reference_batch_size=null", "optim.nesterov=false",
           "device=cuda", "trainer.dtype=float64", "trainer.deterministic=true",
           f"trainer.max_steps={steps}", "trainer.log_every=1", "seed=0", f"hydra.run.dir={run_dir}",
           "trainer.overwrite=true"]  # a check run again into the same OUT: the earlier run goes to previous/
    with open(run_dir.with_suffix(".log"), "w") as log, subprocess.Popen(
            cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT) as proc:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGTERM first: torchrun then ends its workers (a SIGKILL would leave them on the GPU).
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            return "timed out"


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> train loss from <run dir>/metrics.jsonl."""
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("split") == "train" and "loss" in rec:
            out[int(rec["step"])] = float(rec["loss"])
    return out


def compare(a: Path, b: Path) -> dict:
    """Losses per step and final parameters/buffers of two run dirs."""
    la, lb = train_losses(a), train_losses(b)
    steps = sorted(set(la) & set(lb))
    loss_rel = max((abs(la[s] - lb[s]) / max(abs(lb[s]), 1e-30) for s in steps), default=math.inf)
    ma = torch.load(a / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]
    mb = torch.load(b / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]
    keys = sorted(k for k in ma if torch.is_floating_point(ma[k]))
    param_abs = max((float((ma[k].double() - mb[k].double()).abs().max()) for k in keys if ma[k].numel()), default=0.0)
    return {"steps_compared": steps, "losses_syncbn": [la[s] for s in steps], "losses_torch_syncbn": [lb[s] for s in steps],
            "max_loss_rel_diff": loss_rel, "max_param_abs_diff": param_abs, "tensors_compared": len(keys),
            "same_keys": sorted(ma) == sorted(mb)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=45.0, help="seconds per training run")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_train_compare: no CUDA GPU visible; nothing to compare", file=sys.stderr)
        return 2
    nproc = max(1, min(args.nproc, torch.cuda.device_count()))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"nproc": nproc, "gpus": torch.cuda.device_count(), "steps": args.steps,
                    "note": "" if nproc >= 2 else "one GPU visible: one process (NCCL needs one GPU per rank)"}
    for norm in ("syncbn", "torch_syncbn"):
        t0 = time.monotonic()
        rc = run_training(norm, args.out_dir / norm, args.steps, nproc, args.timeout)
        result[f"{norm}_rc"], result[f"{norm}_s"] = rc, round(time.monotonic() - t0, 1)
    ok = result["syncbn_rc"] == 0 and result["torch_syncbn_rc"] == 0
    if ok:
        result.update(compare(args.out_dir / "syncbn", args.out_dir / "torch_syncbn"))
        ok = (result["same_keys"] and len(result["steps_compared"]) >= args.steps
              and result["max_loss_rel_diff"] <= LOSS_RTOL and result["max_param_abs_diff"] <= PARAM_ATOL)
    result["passed"] = ok
    result["tolerances"] = {"loss_rel": LOSS_RTOL, "param_abs": PARAM_ATOL}
    (args.out_dir / "train_compare.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("losses")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
