"""`make study`: the reproduction study, end to end, on the offline MiniLM.

1. deepen-probe on the five tasks suggests which layers to duplicate (passed to the duplicate arm
   through DEEPEN_STUDY_DUPLICATE; --layers pins them and skips the probe).
2. grid A (`+study=cpu_single`) and grid B (`+study=cpu_multi`): one sweep, one MLflow parent each.
3. deepen-report over both sweeps: prints the table, writes <out>/results.{md,csv,png}, logs them
   to both parents. Prints the wall time of each step.
--smoke: the same pipeline at a tiny scale (2 steps, tiny data, seed 1, two tasks) for tests.
Extra arguments are passed to both grids as overrides.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TASKS = "[cola,sst2,mrpc,stsb,rte]"
SMOKE = ["train.max_steps=2", "data.max_train_samples=16", "data.max_eval_samples=32", "data.max_seq_length=32",
         "hydra.sweeper.params.seed=1"]


def sh(cmd: list[str], env: dict | None = None, capture: bool = False) -> str:
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env={**os.environ, **(env or {})}, text=True,
                       stdout=subprocess.PIPE if capture else None)
    if capture:
        print(r.stdout, end="")
    if r.returncode != 0:
        sys.exit(f"study: {Path(cmd[0]).name} failed (exit {r.returncode})")
    return r.stdout or ""


def main() -> None:
    p = argparse.ArgumentParser(prog="study", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "study")
    p.add_argument("--uri", default=f"sqlite:///{ROOT}/outputs/mlflow.db")
    p.add_argument("--layers", help="layers to duplicate, e.g. [4,5]; default: ask deepen-probe")
    p.add_argument("--smoke", action="store_true", help="tiny scale, for a test of the pipeline")
    p.add_argument("--resume", metavar="STAMP", help="continue the interrupted study STAMP (its sweeps dirs' "
                   "<STAMP>-<grid>): each grid continues under its parent run with resume=auto, FINISHED jobs kept")
    a, extra = p.parse_known_args()
    a.out.mkdir(parents=True, exist_ok=True)
    stamp, t0, times = a.resume or time.strftime("%Y%m%d-%H%M%S"), time.time(), {}
    chosen = a.out / "sweeps" / f"{stamp}-layers.txt"  # the layers a resumed study must use again
    layers = a.layers or (chosen.read_text().strip() if a.resume and chosen.is_file() else None)
    if not layers:
        probe = [str(BIN / "deepen-probe"), f"task.names={TASKS}", "probe.suggest=2", "probe.samples=128", "probe.progress=false",
                 f"tracking.uri={a.uri}", f"hydra.run.dir={a.out}/probe-{stamp}"]
        out = sh(probe + (["probe.samples=8"] if a.smoke else []), capture=True)
        m = re.search(r"suggested: backbone\.duplicate_layers=(\[[\d, ]*\])", out)
        if not m:
            sys.exit("study: deepen-probe printed no suggestion")
        layers = m.group(1)
        times["probe"] = time.time() - t0
    print(f"study: {stamp}; if it is interrupted, continue it with: make study STUDY_ARGS='--resume {stamp}'",
          flush=True)
    print(f"study: duplicating layers {layers}", flush=True)
    chosen.parent.mkdir(parents=True, exist_ok=True)
    chosen.write_text(f"{layers}\n")
    sweeps = []
    for grid in ("cpu_single", "cpu_multi"):
        t = time.time()
        sweep_dir = a.out / "sweeps" / f"{stamp}-{grid}"
        grid_args = SMOKE + (["hydra.sweeper.params.task='rte,mrpc'"] if grid == "cpu_single" else []) \
            if a.smoke else []
        sh([str(BIN / "deepen-run"), "-m", f"+study={grid}", f"tracking.uri={a.uri}",
            f"hydra.sweep.dir={sweep_dir}", *grid_args, *extra, *(["resume=auto"] if a.resume else [])],
           env={"DEEPEN_STUDY_DUPLICATE": layers})
        sweeps.append(json.loads((sweep_dir / "deepen_sweep.json").read_text())["sweep_id"])
        times[grid] = time.time() - t
    experiment = json.loads((sweep_dir / "deepen_sweep.json").read_text())["experiment"]
    report = [str(BIN / "deepen-report"), "--uri", a.uri, "--experiment", experiment, "--out", str(a.out),
              "--log-to-parent"] + [x for s in sweeps for x in ("--sweep-id", s)]
    sh(report)
    times["total"] = time.time() - t0
    (a.out / "timing.json").write_text(json.dumps({"date": stamp, "sweeps": sweeps, "layers": layers,
                                                   "seconds": times}, indent=1))
    print("study: wall time " + "  ".join(f"{k} {v / 60:.1f} min" for k, v in times.items()))


if __name__ == "__main__":
    main()
