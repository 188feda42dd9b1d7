"""`make study`: the floor study (docs/study.md), part by part, on the offline MiniLM.

  make study PART=pilot   the new-parameter learning-rate rule (seed 0, left out of every table)
  make study PART=base    the baseline, mean pooling and pooler; single-task at matched updates
  make study PART=hire    HIRE: dynamic, mean and random importance; the capacity control
  make study PART=dup     k = 2 duplicated layers: the probe's, random, the top
  make study PART=multi   PALs and the multi-task baseline
  make study              every primary part in that order, then the whole report
  PART=sched, PART=gru    the secondary questions (not in the default run)
  PART=ablations          the older ablation presets (abl_*), reported on their own sweeps

Each part is one sweep per preset in a fixed folder (outputs/study-floor/<part>/<preset>) run with
resume=auto: a part that was killed continues where it stopped when the same command runs again.
After each part: deepen-report over exactly that part's sweeps (and the base part's, whose
mean-pooling baseline the other rows pair with), with the part's named contrasts; its table in
outputs/study-floor/<part>/. The sweep ids are kept in outputs/study-floor/sweeps.json.
--draw-layers K: print the seeded random draw of K layers that floor_dup.yaml records.
--smoke: a tiny scale (tiny data and batches, one seed) for a test of the pipeline. Extra arguments go to every sweep.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Smoke: tiny data and batches, but each preset's own step counts (the matched-updates rows differ by them).
SMOKE = ["train.batch_size=2", "data.max_train_samples=16", "data.max_eval_samples=32", "data.max_seq_length=32"]
BASELINE = "pooling=mean"  # the baseline every floor row is paired with (--baseline)
# Row selectors of deepen-report --contrast (deepen_run/report/contrasts.py, select).
MEAN_BASE = "method=baseline pooling=mean duplicate_layers=[] max_steps=150 setup=single"
PARTS: dict[str, dict] = {
    "pilot": {"presets": ["floor_pilot", "floor_pilot_multi"], "contrasts": []},
    "base": {"presets": ["floor_base", "floor_matched"],
             "contrasts": [f"{MEAN_BASE}:method=baseline pooling=pooler"]},
    "hire": {"presets": ["floor_hire", "floor_capacity"],
             "contrasts": [f"method=hire importance=dynamic extractor=true:{MEAN_BASE}",
                           "method=hire importance=dynamic extractor=true:extractor=false",
                           "method=hire importance=dynamic extractor=true:method=hire importance=mean",
                           "method=hire importance=dynamic extractor=true:method=hire importance=random"]},
    "dup": {"presets": ["floor_dup"],
            "contrasts": [f"duplicate_layers=[1,2]:{MEAN_BASE}", "duplicate_layers=[1,2]:duplicate_layers=[1,4]",
                          "duplicate_layers=[1,2]:duplicate_layers=[4,5]"]},
    "multi": {"presets": ["floor_multi"], "needs": ["floor_matched"],
              "contrasts": ["method=pals:method=baseline setup=multi",
                            "method=pals:method=baseline setup=single max_steps=300"]},
    "sched": {"presets": ["floor_sched"], "needs": ["floor_multi"], "secondary": True,
              "contrasts": ["method=pals schedule=proportional:method=pals schedule=annealed",
                            "method=pals schedule=sqrt:method=pals schedule=annealed"]},
    "gru": {"presets": ["floor_gru"], "needs": ["floor_hire"], "secondary": True,
            "contrasts": ["gru_layers=1:method=hire gru_layers=2 importance=dynamic extractor=true",
                          "gru_layers=3:method=hire gru_layers=2 importance=dynamic extractor=true"]},
    "ablations": {"presets": ["abl_hire", "abl_duplicate", "abl_lr"], "contrasts": [], "own": True},
}
PRIMARY = ["pilot", "base", "hire", "dup", "multi"]
LR_ENV = {"baseline": "DEEPEN_STUDY_LR_BASELINE", "hire": "DEEPEN_STUDY_LR_HIRE", "pals": "DEEPEN_STUDY_LR_PALS"}


def draw_layers(k: int, seed: int, n_layers: int = 6) -> list[int]:
    return sorted(random.Random(seed).sample(range(n_layers), k))


def sh(cmd: list[str], env: dict | None = None, capture: bool = False) -> str:
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env={**os.environ, **(env or {})}, text=True, stdout=subprocess.PIPE if capture else None)
    if r.returncode != 0:
        sys.exit(f"study: {Path(cmd[0]).name} failed (exit {r.returncode}); run the same command again to continue")
    return r.stdout or ""


def lr_rule(out: Path, uri: str, sweeps: dict) -> dict[str, float]:
    """Per method, the pilot's new_params_lr_scale with the higher average (baseline and HIRE on
    single-task rows, PALs on multi-task ones) -> outputs/study-floor/lr_rule.json."""
    ids = [x for p in PARTS["pilot"]["presets"] for x in ("--sweep-id", sweeps[p])]
    table = json.loads(sh([str(BIN / "deepen-report"), "--uri", uri, "--experiment", "study-floor", "--json", *ids],
                          capture=True))
    best: dict[str, tuple[float, float]] = {}
    for row in table["rows"]:
        method, single = row["method"], row["setup"] == "single-task"
        if (method == "pals") == single:
            continue  # PALs' rule from multi-task rows, the others' from single-task rows
        tasks = list(row["per_seed"])
        avg = sum(v for t in tasks for v in row["per_seed"][t].values()) / sum(len(row["per_seed"][t]) for t in tasks)
        scale = float(row["config"]["train.new_params_lr_scale"])
        if method not in best or avg > best[method][1]:
            best[method] = (scale, avg)
    rule = {m: s for m, (s, _) in best.items()}
    (out / "lr_rule.json").write_text(json.dumps({"rule": "per method, the pilot's (seed 0) better average of "
                                                  "new_params_lr_scale 1 and 10", "scale": rule,
                                                  "pilot_avg": {m: a for m, (_, a) in best.items()}}, indent=1))
    print(f"study: new-parameter learning-rate scale per method: {rule}", flush=True)
    return rule


def report_command(uri: str, ids: list[str], contrasts: list[str], own: bool = False) -> list[str]:
    cmd = ["deepen-report", "--uri", uri, "--experiment", "study" if own else "study-floor"] + \
        (["--tasks", "sst2,stsb"] if own else ["--baseline", BASELINE])
    return cmd + [x for i in ids for x in ("--sweep-id", i)] + [x for c in contrasts for x in ("--contrast", c)]


def report(uri: str, out: Path, ids: list[str], contrasts: list[str], own: bool = False) -> None:
    cmd = report_command(uri, ids, contrasts, own)
    cmd = [str(BIN / cmd[0]), *cmd[1:], "--out", str(out), "--seeds-csv", str(out / "seeds.csv")]
    sh(cmd)
    json_out = sh(cmd + ["--json"], capture=True)
    (out / "report.json").write_text(json_out)


def what_to_report(name: str, sweeps: dict) -> tuple[list[str], list[str], bool]:
    """(sweep ids, contrasts, own) of a part's report; name "all": every primary row and contrast."""
    if name == "all":
        presets = [p for n in PRIMARY[1:] for p in PARTS[n]["presets"]]
        contrasts, own = [c for n in PRIMARY for c in PARTS[n]["contrasts"]], False
    else:
        part, own = PARTS[name], PARTS[name].get("own", False)
        presets = ([] if own else ["floor_base"] + part.get("needs", [])) + part["presets"]
        contrasts = part["contrasts"]
    missing = [p for p in presets if p not in sweeps]
    if missing:
        sys.exit(f"study: the report of {name} needs the sweeps {', '.join(missing)}; run their parts first "
                 "(make study PART=...)")
    return [sweeps[p] for p in dict.fromkeys(presets)], contrasts, own


def run_part(name: str, a, extra: list[str], sweeps: dict) -> None:
    part, t0 = PARTS[name], time.time()
    env = {}
    if name not in ("pilot", "ablations"):
        rule_file = a.out / "lr_rule.json"
        if not rule_file.is_file():
            sys.exit("study: no learning-rate rule yet; run `make study PART=pilot` first")
        env = {LR_ENV[m]: str(s) for m, s in json.loads(rule_file.read_text())["scale"].items() if m in LR_ENV}
    for preset in part["presets"]:
        sweep_dir = a.out / name / preset
        sh([str(BIN / "deepen-run"), "-m", f"+study={preset}", f"tracking.uri={a.uri}", f"hydra.sweep.dir={sweep_dir}",
            "resume=auto", *(SMOKE + ["hydra.sweeper.params.seed=1"] if a.smoke and name != "pilot" else
                             SMOKE if a.smoke else []), *extra], env=env)
        sweeps[preset] = json.loads((sweep_dir / "deepen_sweep.json").read_text())["sweep_id"]
        (a.out / "sweeps.json").write_text(json.dumps(sweeps, indent=1))
    if name == "pilot":
        lr_rule(a.out, a.uri, sweeps)
        return
    report(a.uri, a.out / name, *what_to_report(name, sweeps))
    print(f"study: part {name} took {(time.time() - t0) / 60:.1f} min", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="study", description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=list(PARTS), help="one part (default: every primary part, then the report)")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "study-floor")
    p.add_argument("--uri", default=f"sqlite:///{ROOT}/outputs/mlflow.db")
    p.add_argument("--smoke", action="store_true", help="tiny scale, for a test of the pipeline")
    p.add_argument("--command", action="store_true",
                   help="print the deepen-report command of the part's report (default: the whole study's) and exit")
    p.add_argument("--draw-layers", type=int, metavar="K", help="print the random K-layer draw and exit")
    p.add_argument("--layer-seed", type=int, default=1)
    a, extra = p.parse_known_args()
    if a.draw_layers:
        print(draw_layers(a.draw_layers, a.layer_seed))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    sweeps = json.loads((a.out / "sweeps.json").read_text()) if (a.out / "sweeps.json").is_file() else {}
    if a.command:  # the report's deepen-report command with this study's sweep ids, to run by hand
        cmd = report_command(a.uri, *what_to_report(a.part or "all", sweeps))
        if a.uri == p.get_default("uri"):
            cmd[1:3] = []  # deepen-report's default store is this one
        print(shlex.join(cmd))
        return
    for name in [a.part] if a.part else PRIMARY:
        run_part(name, a, extra, sweeps)
    if not a.part:  # the whole primary study: every row and every primary contrast in one report
        report(a.uri, a.out / "all", *what_to_report("all", sweeps))


if __name__ == "__main__":
    main()
