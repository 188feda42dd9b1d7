"""Tables, targets and files of `make bench` (outputs/bench/bench.json and bench.md)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import transformers

from . import accuracy, compiled, cpu, limit, phases, startup

# The acceptance targets (issue 7).
SPEED_VS_TRAINER, SPEED_VS_PAD128, EFFICIENCY, ACC_POINTS = 1.0, 2.0, 0.9, 1.0
METHOD_LIMITS = {"hire": 2.0, "pals": 1.25}


def environment(device, load0, wall_s: float, machine: dict) -> dict:
    """machine: cpu.describe() of this run, taken when it started."""
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else machine["model"]
    return {"device": f"{device.type} ({name})", "cpu": machine, "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "loadavg_start": load0,
            "loadavg_end": os.getloadavg(), "wall_s": round(wall_s, 1)}


def targets(r: dict) -> list[dict]:
    """The rows of whatever sections ran (--only runs some)."""
    out = startup.targets(r["startup"]) if "startup" in r else []
    if "versus" in r:
        v, job = r["versus"], f"whole {r['versus']['steps']}-step SST-2 process"
        out.append({"target": f"{job}: Trainer (fp32) s / deepen-run s", "measured": v["x_trainer"],
                    "wanted": ">= 1.5", "met": v["x_trainer"] >= 1.5})
        if "x_trainer_bf16" in v:
            out.append({"target": f"{job}: Trainer bf16=True s / deepen-run s", "measured": v["x_trainer_bf16"],
                        "wanted": ">= 1.2", "met": v["x_trainer_bf16"] >= 1.2})
            gap = 100 * abs(v["accuracy"]["deepen-run"] - v["accuracy"]["trainer"])
            out.append({"target": f"{job}: \\|dev accuracy - Trainer's\\| (points)", "measured": gap,
                        "wanted": "<= 1.0", "met": gap <= 1.0})
    if "accuracy" in r:
        acc = r["accuracy"]
        out.append({"target": "bf16 - fp32 mean dev accuracy, within fp32's spread over seeds",
                    "measured": acc["bf16_minus_fp32"], "wanted": f"\\|x\\| <= {acc['fp32_spread']:.4f}",
                    "met": acc["holds"]})
    rows = race_targets(r["race"]) if "race" in r else []
    for name, cap in METHOD_LIMITS.items() if "methods" in r else ():
        m = r["methods"].get(name)
        if m and "x_baseline" in m:
            rows.append((f"{name} step time / baseline", m["x_baseline"], f"<= {cap}", m["x_baseline"] <= cap))
        else:
            rows.append((f"{name} step time / baseline", float("nan"), f"<= {cap}", None))
    return out + [{"target": t, "measured": v, "wanted": w, "met": ok} for t, v, w, ok in rows]


def race_targets(race: dict) -> list[tuple]:
    dr = race["deepen-run"]
    return [
        ("examples/s vs Trainer (same batches)", race["trainer"]["deepen_run_speedup"], f">= {SPEED_VS_TRAINER}",
         race["trainer"]["deepen_run_speedup"] >= SPEED_VS_TRAINER),
        ("examples/s vs Trainer padded to 128", race["trainer-pad128"]["deepen_run_speedup"], f">= {SPEED_VS_PAD128}",
         race["trainer-pad128"]["deepen_run_speedup"] >= SPEED_VS_PAD128),
        ("efficiency (vs bare loop)", race["bare"]["deepen_run_speedup"], f">= {EFFICIENCY}",
         race["bare"]["deepen_run_speedup"] >= EFFICIENCY),
        ("\\|dev accuracy - Trainer's\\| (points)", 100 * abs(dr["dev_accuracy"] - race["trainer"]["dev_accuracy"]),
         f"<= {ACC_POINTS}", 100 * abs(dr["dev_accuracy"] - race["trainer"]["dev_accuracy"]) <= ACC_POINTS),
    ]


def _table(head: list[str], rows: list[list]) -> str:
    def cell(x):
        return f"{x:,.3f}" if isinstance(x, float) and abs(x) < 10 else f"{x:,.1f}" if isinstance(x, float) else str(x)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(r: dict) -> str:
    s, env = r["settings"], r["env"]
    out = [cpu.header(env["cpu"]), ""]  # first: every number below is this CPU's
    if "race" in r:
        out += race_markdown(s, r["race"], env)
    out += ["### Targets", ""]
    out.append(_table(["target", "measured", "wanted", "met"],
                      [[t["target"], t["measured"], t["wanted"], {True: "yes", False: "NO", None: "n/a"}[t["met"]]]
                       for t in r["targets"]]))
    if "methods" in r:
        out += ["", f"### Method step time ({s['method_steps']} steps x {s['rounds'] - 1} rounds, batch "
                f"{s['batch_size']}, {'every token real' if s['method_batches'] == 'full' else 'real examples'})", ""]
        rows = [[n, m["step_ms"], m.get("x_baseline", float("nan")), m["peak_mem_mb"], f"{m['params_total']:,}",
                 f"{m['params_trainable']:,}"] for n, m in r["methods"].items()]
        out.append(_table(["method", "ms/step", "x baseline", "peak mem MB", "params", "trainable"], rows))
        if r.get("skipped"):
            out += [""] + [f"- skipped {n}: {why}" for n, why in r["skipped"].items()]
    if "lengths" in r:
        out += ["", "### Step time vs sequence length (baseline, every example padded to the length)", ""]
        rows = [[n, m["step_ms"], m["examples_per_s"], m["x_shortest"], m["peak_mem_mb"]]
                for n, m in r["lengths"].items()]
        out.append(_table(["length", "ms/step", "examples/s", "x shortest", "peak mem MB"], rows))
        out += ["", "Peak memory: growth of the process's peak RSS (CPU) or of torch.cuda.max_memory_allocated "
                "(GPU) during a contender's chunks over what was resident at the chunk's start (weights): "
                "gradients, optimizer state, activations, batches."]
    if "startup" in r:
        out += ["", startup.markdown(r["startup"])]
    if "versus" in r:
        out += ["", phases.markdown(r["versus"])]
    if "accuracy" in r:
        out += ["", accuracy.markdown(r["accuracy"])]
    if "limit" in r:
        out += ["", limit.markdown(r["limit"])]
    if "compile" in r:
        out += ["", compiled.markdown(r["compile"])]
    out += [f"torch {env['torch']}, transformers {env['transformers']}, load average {env['loadavg_start'][0]:.1f} "
            f"-> {env['loadavg_end'][0]:.1f}, bench wall time {env['wall_s']:.0f} s."]
    return "\n".join(out) + "\n"


def race_markdown(s: dict, race: dict, env: dict) -> list[str]:
    pad = race["padding"]
    out = [f"### Throughput: {s['backbone']} on {s['task']}, {s['steps']} steps x batch {s['batch_size']}, "
           f"lr {s['lr']}, {env['device']}, {env['threads']} threads",
           "",
           f"Same examples in the same order for all; medians over {s['steps'] // s['chunk'] - 1} interleaved "
           f"chunks of {s['chunk']} steps (first chunk = warm-up). Real tokens {pad['real_tokens']:,}; "
           f"computed with dynamic padding {pad['dynamic_padded_tokens']:,}, padded to {s['max_len']} "
           f"{pad['pad128_tokens']:,}.",
           ""]
    rows = []
    for n in ("deepen-run", "trainer", "trainer-pad128", "bare"):
        c = race[n]
        speed = 1.0 if n == "deepen-run" else c["deepen_run_speedup"]
        acc = f"{100 * c['dev_accuracy']:.2f}" if "dev_accuracy" in c else "-"
        rows.append([n, c["examples_per_s"], c["tokens_per_s"], c["step_ms"], speed, acc, c["peak_mem_mb"]])
    out.append(_table(["contender", "examples/s", "tokens/s", "ms/step", "deepen-run speed-up (bare: efficiency)",
                       "dev acc %", "peak mem MB"], rows))
    return out + [""]


def save(r: dict, md: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(r, indent=2, default=str) + "\n")
    (out / "bench.md").write_text(md)
    print(f"bench: wrote {out / 'bench.json'} and {out / 'bench.md'}")
