"""`make bench`: deepen-run's speed on this machine, side by side with the Hugging Face Trainer.

The one entry point of the bench (its parts: scripts/benchkit/). Its first line names the CPU and the
flags that decide what train.*=auto does there (benchkit/cpu.py). Prints Markdown tables and writes
outputs/bench/bench.{json,md}; `--only` runs some sections, in this order:

  startup   whole processes: a dry run and a rejected override as ratios to `python -c "import torch"`,
            and a 60-step HIRE run as a ratio to the same baseline run (benchkit/startup.py)
  phases    the whole 150-step SST-2 process against the Trainer's (fp32 default and bf16=True), phase
            by phase, rounds taking turns (benchkit/phases.py, benchkit/trainer_job.py)
  accuracy  bf16 vs fp32 dev accuracy over 3 seeds, whole deepen-run processes (benchkit/accuracy.py)
  race      throughput of deepen-run, the Trainer (dynamic padding), the Trainer padded to 128 as
            run_glue.py does, and a bare forward/backward/AdamW loop (the ceiling); dev accuracy of each
            after the same steps; peak memory growth (benchkit/contenders.py, benchkit/race.py)
  methods   step time of every registered method (duplicate with k = 1, 2, 4 layers) vs baseline
  lengths   step time vs sequence length (32, 64, 128, 256)
  limit     peak matmul GFLOP/s in fp32 and bf16, the model FLOP/s of MiniLM and BERT-base-sized steps
            as a fraction of it, a step's profile by op group (benchkit/limit.py)
  compile   train.compile: compile seconds and the compiled step against the eager one (benchkit/compiled.py)

Contenders take turns in chunks of steps and reports are medians over chunks or rounds, so a noisy
shared machine yields fair ratios (absolute numbers move with the load).

    python scripts/bench.py                 # every section: what `make bench` runs (MiniLM, SST-2)
    python scripts/bench.py --quick         # smoke run, a few minutes (no compile section)
    python scripts/bench.py --only phases   # deepen-run vs the Trainer, 3 rounds of 150 steps
    python scripts/bench.py --only limit compile
    python scripts/bench.py --backbone bert_base --steps 200 --only race
    python scripts/bench.py --only methods --method-batches full --method-override method.gru_layers=3
                                            # method step times alone (HIRE's worst case: no padding)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from benchkit import accuracy, compiled, cpu, limit, phases, startup  # noqa: E402
from benchkit import contenders as bc  # noqa: E402
from benchkit import report as bench_report  # noqa: E402
from benchkit.race import Baton, Lap, Memory, median, run_threads, sync  # noqa: E402
from deepen_run.model import backbone as bb  # noqa: E402
from deepen_run.data import loaders as gd  # noqa: E402
from deepen_run.model import steps as backbone_steps  # noqa: E402
from deepen_run.data import tsv  # noqa: E402
from deepen_run.config.schema import ROOT, register  # noqa: E402
from deepen_run.methods import schemas  # noqa: E402
from deepen_run.precision import resolve_precision  # noqa: E402
from deepen_run.data.glue import get_tasks  # noqa: E402
from deepen_run.methods import METHODS  # noqa: E402
from deepen_run.model.heads import count  # noqa: E402
from deepen_run.util import first_line, one_line  # noqa: E402

RACE = ("deepen-run", "trainer", "trainer-pad128", "bare")
SECTIONS = ("startup", "phases", "accuracy", "race", "methods", "lengths", "limit", "compile")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)  # --quick reads what was typed
    p.add_argument("--backbone", default="minilm", help="a conf/backbone name (default: the offline MiniLM)")
    p.add_argument("--task", default="sst2", help="a single-task GLUE classification config (default sst2)")
    p.add_argument("--steps", type=int, default=60, help="training steps per contender (a multiple of --chunk)")
    p.add_argument("--chunk", type=int, default=10, help="steps per turn; the first chunk is warm-up")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--max-len", type=int, default=128, help="truncation, and run_glue.py's padded length")
    p.add_argument("--group-by-length", action="store_true", help="order examples with data.group_by_length")
    p.add_argument("--method-steps", type=int, default=3, help="steps per method per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the method / length tables (first = warm-up)")
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--dup-k", type=int, nargs="+", default=[1, 2, 4], help="layers duplicated (the top k)")
    p.add_argument("--max-eval", type=int, default=None, help="dev examples (default: all)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default=str(ROOT / "outputs" / "bench"))
    p.add_argument("--quick", action="store_true", help="smoke run: few steps, short table")
    p.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                   help=f"run these sections alone, of: {', '.join(SECTIONS)} (default: all)")
    p.add_argument("--startup-rounds", type=int, default=3, help="interleaved start-up rounds after a warm-up")
    p.add_argument("--whole-rounds", type=int, default=2,
                   help="interleaved rounds of the whole 60-step hire/baseline runs (0: skip them)")
    p.add_argument("--versus-rounds", type=int, default=3,
                   help="interleaved pairs of whole processes, deepen-run vs the Trainer, phase by phase (0: skip)")
    p.add_argument("--versus-steps", type=int, default=150, help="training steps of those whole processes")
    p.add_argument("--compile-steps", type=int, default=12, help="timed steps of the compile section, each way")
    p.add_argument("--accuracy-seeds", type=int, nargs="*", default=[1, 2, 3],
                   help="seeds of the bf16 vs fp32 accuracy runs (none: skip them)")
    p.add_argument("--accuracy-steps", type=int, default=150, help="training steps of those runs")
    p.add_argument("--accuracy-train-samples", type=int, default=None, help="their data.max_train_samples")
    p.add_argument("--accuracy-max-len", type=int, default=128, help="their data.max_seq_length")
    p.add_argument("--method-batches", choices=("sst2", "full"), default="sst2",
                   help="method table batches: real examples, dynamically padded (sst2) or every token real (full)")
    p.add_argument("--method-override", nargs="*", default=[], help="Hydra overrides for every method model")
    a = p.parse_args(argv)
    if a.quick:  # smaller defaults: what the command line gave stays (--quick --versus-rounds 0 skips that part)
        quick = dict(steps=8, chunk=4, method_steps=1, rounds=2, lengths=[32, 64], max_eval=128, startup_rounds=1,
                     whole_rounds=0, versus_rounds=1, versus_steps=3, accuracy_seeds=a.accuracy_seeds[:1],
                     accuracy_steps=3, accuracy_train_samples=200, accuracy_max_len=64)
        typed = {arg.split("=", 1)[0] for arg in (sys.argv[1:] if argv is None else argv) if arg.startswith("--")}
        for k, v in quick.items():
            if "--" + k.replace("_", "-") not in typed:
                setattr(a, k, v)
    # --quick leaves out the compile section (a minute or more of compiling) unless --only names it.
    a.sections = list(a.only) if a.only else [s for s in SECTIONS if not (a.quick and s == "compile")]
    if a.steps % a.chunk or a.steps // a.chunk < 2:
        p.error("--steps must be a multiple of --chunk, at least two chunks")
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:  # before the long sections: a bad --backbone or --task is found in seconds, in one line
        tasks = get_tasks(list(compose_cfg(a).task.names))
    except (HydraException, OmegaConfBaseException) as e:
        p.error(f"--backbone {a.backbone} --task {a.task}: {one_line(e)}")
    if len(tasks) != 1 or tasks[0].is_regression or len(tasks[0].eval_names) != 1:
        p.error(f"--task {a.task}: use one single-dev-set classification task (sst2, cola, mrpc, ...)")
    return a


def compose_cfg(a, *extra: str):
    register(schemas())
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=[
            f"backbone={a.backbone}", f"task={a.task}", f"train.batch_size={a.batch_size}",
            f"train.learning_rate={a.lr}", f"train.max_steps={a.steps}", f"data.max_seq_length={a.max_len}",
            f"data.max_eval_samples={a.max_eval if a.max_eval else 'null'}", f"seed={a.seed}", *extra])


def example_order(train, a) -> list[int]:
    gen = torch.Generator().manual_seed(a.seed)
    if a.group_by_length:
        return list(gd.length_grouped(train, a.batch_size, gen))
    return torch.randperm(len(train), generator=gen).tolist()


def race(a, cfg, spec, tok, ordered, dev, init_state, device, tmp) -> dict:
    baton = Baton(list(RACE))
    laps = {n: Lap(n, baton, a.chunk, device) for n in RACE}
    batches = bc.device_batches(tok, ordered, a.batch_size, a.seed, device)
    bodies = {
        "deepen-run": lambda: bc.deepen_run(cfg, spec, tok, ordered, dev, init_state, laps["deepen-run"],
                                            f"sqlite:///{tmp}/bench-mlflow.db"),
        "trainer": lambda: bc.trainer(cfg, spec, tok, ordered, dev, init_state, laps["trainer"]),
        "trainer-pad128": lambda: bc.trainer(cfg, spec, tok, ordered, dev, init_state, laps["trainer-pad128"],
                                             pad_to=a.max_len),
        "bare": lambda: bc.bare(cfg, spec, batches, init_state, laps["bare"], device),
    }
    results = run_threads(baton, bodies)
    lengths = [len(x) for x in ordered.with_format(None)["input_ids"]]
    per_chunk = a.batch_size * a.chunk
    ex = [min(per_chunk, len(lengths) - i) for i in range(0, len(lengths), per_chunk)]
    tk = [sum(lengths[i:i + per_chunk]) for i in range(0, len(lengths), per_chunk)]
    out = {}
    for n in RACE:
        t = laps[n].times[1:]  # chunk 0 = warm-up
        out[n] = {"examples_per_s": median([e / s for e, s in zip(ex[1:], t)]),
                  "tokens_per_s": median([k / s for k, s in zip(tk[1:], t)]),
                  "step_ms": 1000 * median(t) / a.chunk, "chunks_s": laps[n].times,
                  "peak_mem_mb": max(laps[n].peaks) / 2**20, **results.get(n, {})}
    ref = laps["deepen-run"].times[1:]
    for n in RACE[1:]:  # paired per chunk: both ran the same batches seconds apart
        out[n]["deepen_run_speedup"] = median([o / d for o, d in zip(laps[n].times[1:], ref)])
    pad = sum(max(lengths[i:i + a.batch_size]) * len(lengths[i:i + a.batch_size])
              for i in range(0, len(lengths), a.batch_size))
    out["padding"] = {"real_tokens": sum(lengths), "dynamic_padded_tokens": pad,
                      "pad128_tokens": a.max_len * len(lengths)}
    return out


def rounds(a, steppers: dict, batches_of, device) -> dict:
    """Interleaved rounds (order rotated each round); round 0 is warm-up for time."""
    names = list(steppers)
    times = {n: [] for n in names}
    peaks = {n: [] for n in names}
    mem = Memory(device)
    for r in range(a.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            step, batches = steppers[n], batches_of(n)
            mem.start()
            t0 = time.perf_counter()
            for b in batches:
                step(b)
            sync(device)
            times[n].append((time.perf_counter() - t0) / len(batches))
            peaks[n].append(mem.peak())
    return {n: {"step_ms": 1000 * median(times[n][1:]), "rounds_ms": [1000 * t for t in times[n]],
                "peak_mem_mb": max(peaks[n]) / 2**20, "_t": times[n][1:]} for n in names}


def method_table(a, cfg, spec, tok, ordered, device) -> dict:
    depth = bb.load_model(cfg.backbone).config.num_hidden_layers
    variants = {}
    for name in METHODS:  # whatever the registry holds: new methods join the table by themselves
        if name == "duplicate":
            for k in a.dup_k:
                if k <= depth:
                    variants[f"duplicate k={k}"] = ("duplicate", [f"method.layers=[{','.join(map(str, range(depth - k, depth)))}]"])
        else:
            variants[name] = (name, [])
    steppers, info, skipped = {}, {}, {}
    precision = resolve_precision(cfg.train.mixed_precision)
    for label, (name, extra) in variants.items():
        try:
            mcfg = compose_cfg(a, f"method={name}", *extra, *(a.method_override if name != "baseline" else []))
            torch.manual_seed(a.seed)
            model = METHODS[name].build(backbone_steps.load(mcfg)[0], mcfg.method, [spec])
        except Exception as e:  # noqa: BLE001 (a method mid-development must not sink the bench)
            skipped[label] = first_line(e, 200)
            continue
        st = bc.Stepper(model, mcfg.train, device, precision)
        steppers[label] = lambda b, st=st: st.step(spec.name, b, spec.is_regression)
        info[label] = {"params_total": count(model), "params_trainable": count(model, True)}
    if a.method_batches == "full":
        batches = bc.full_batches(a.batch_size, a.max_len, a.method_steps, device, a.seed)
    else:
        batches = bc.device_batches(tok, ordered, a.batch_size, a.seed, device)[:a.method_steps]
    res = rounds(a, steppers, lambda n: batches, device)
    base = res.get("baseline")
    for n, r in res.items():
        r.update(info[n])
        if base:
            r["x_baseline"] = median([t / b for t, b in zip(r["_t"], base["_t"])])
    for r in res.values():
        r.pop("_t")
    return {"methods": res, "skipped": skipped}


def length_table(a, cfg, spec, tok, ordered, init_state, device) -> dict:
    limit = bb.load_model(cfg.backbone).config.max_position_embeddings
    lengths = [n for n in a.lengths if n <= limit]
    st = bc.Stepper(bc.baseline_model(cfg, [spec], init_state)[0], cfg.train, device,
                    resolve_precision(cfg.train.mixed_precision))
    batches = {n: bc.fixed_length_batches(tok, ordered, a.batch_size, n, a.method_steps, device) for n in lengths}
    res = rounds(a, {n: (lambda b: st.step(spec.name, b)) for n in lengths}, lambda n: batches[n], device)
    first = res[lengths[0]]["_t"] if lengths else []
    for r in res.values():
        r["examples_per_s"] = 1000 * a.batch_size / r["step_ms"]
        r["x_shortest"] = median([t / f for t, f in zip(r.pop("_t"), first)])
    return {str(n): r for n, r in res.items()}


def in_worker(fn):
    return run_threads(Baton(["worker"]), {"worker": fn})["worker"]


def main(argv=None) -> dict:
    a = parse(argv)
    machine = cpu.describe()
    print(cpu.header(machine), flush=True)  # first: every number that follows is this CPU's
    t_start, load0 = time.time(), os.getloadavg()
    report = {"settings": vars(a)}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run = set(a.sections)
    # The whole processes first, before this process's threads load the machine.
    if "startup" in run:
        print("bench: start-up rounds", flush=True)
        report["startup"] = startup.measure(a.startup_rounds, a.whole_rounds)
    if "phases" in run and a.versus_rounds:
        report["versus"] = phases.measure(a.versus_rounds, a.versus_steps)
    if "accuracy" in run and a.accuracy_seeds:
        report["accuracy"] = accuracy.measure(argparse.Namespace(
            steps=a.accuracy_steps, seeds=a.accuracy_seeds, train_samples=a.accuracy_train_samples,
            max_len=a.accuracy_max_len))
    if run & {"race", "methods", "lengths"}:
        training(a, report, run)
    bf16 = bool(run & {"limit", "compile"}) and resolve_precision(compose_cfg(a).train.mixed_precision) == "bf16"
    if "limit" in run:
        print("bench: the machine's limit", flush=True)
        report["limit"] = in_worker(lambda: limit.measure(device, bf16, a.quick))
    if "compile" in run and a.compile_steps:
        print("bench: train.compile against eager", flush=True)
        report["compile"] = in_worker(lambda: compiled.measure(bf16, steps=a.compile_steps))
    report["env"] = bench_report.environment(device, load0, time.time() - t_start, machine)
    report["targets"] = bench_report.targets(report)
    md = bench_report.markdown(report)
    print(md)
    bench_report.save(report, md, Path(a.out))
    return report


def training(a, report: dict, run: set) -> None:
    """The race, the method table and the length table (those in `run`), into `report`."""
    cfg = compose_cfg(a)
    (spec,) = get_tasks(list(cfg.task.names))  # one classification task with one dev set (parse)
    tsv.check_glue_dir(cfg.data.glue_dir, [spec])
    tok = bb.load_tokenizer(cfg.backbone)
    data = gd.load_task(spec, cfg.data, tok, a.seed)
    dev = data.dev[spec.eval_names[0]]
    need = a.steps * a.batch_size
    if len(data.train) < need:
        raise SystemExit(f"bench: {spec.name} has {len(data.train)} training examples; --steps x --batch-size needs {need}")
    ordered = data.train.select(example_order(data.train, a)[:need])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(a.seed)
    init_state = {k: v.clone() for k, v in bc.baseline_model(cfg, [spec])[0].state_dict().items()}
    import tempfile

    tmp = tempfile.mkdtemp(prefix="deepen-bench-")
    print(f"bench: {a.backbone} on {spec.name}, {a.steps} steps x {a.batch_size}, device {device}, "
          f"{torch.get_num_threads()} threads", flush=True)
    if "race" in run:
        report["race"] = race(a, cfg, spec, tok, ordered, dev, init_state, device, tmp)
        print("bench: race done", flush=True)
    # Same kind of thread as the race: torch's CPU thread pool behaves differently in the main
    # thread (much slower per small op when the cores are oversubscribed), so mixing would skew.
    if "methods" in run:
        report.update(in_worker(lambda: method_table(a, cfg, spec, tok, ordered, device)))
        print("bench: methods done", flush=True)
    if "lengths" in run:
        report["lengths"] = in_worker(lambda: length_table(a, cfg, spec, tok, ordered, init_state, device))


if __name__ == "__main__":
    main()
