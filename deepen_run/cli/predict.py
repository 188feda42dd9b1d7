"""`deepen-predict`: a trained model's labels and probabilities (the STS-B score; HIRE's layer
importances too) for sentences or pairs from the arguments, a TSV file or stdin (docs/use-a-model.md).

The model is named as deepen_run.load takes it (a run id, a run folder, a models:/ URI or an export
folder); its config comes from the run, so nothing of the training command is repeated. Bad input
(an unknown run, a run that kept no weights, a pair for a one-sentence task) is one line and exit 2,
before any weights load.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from deepen_run.errors import UserError, fail_with  # noqa: E402

EXAMPLES = """Examples:
  deepen-predict --run <run id> "a gorgeous, witty film"
  deepen-predict --run outputs/runs/<day>/<time> --tsv $DEEPEN_GLUE_DIR/SST-2/dev.tsv --out dev.tsv
  deepen-predict --run models:/sst2-model@champion --pair "A man plays." "Someone is playing."   (a pair task)
  printf 'good\\nbad\\n' | deepen-predict --run <export folder>
"""


def parse(argv: Optional[list[str]]):
    p = argparse.ArgumentParser(prog="deepen-predict", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    p.add_argument("texts", nargs="*", help="sentences (a pair: 'first<TAB>second'); none: --tsv, else stdin")
    p.add_argument("--run", required=True, metavar="RUN", help="run id, run folder, models:/ URI or export folder")
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"), help="a sentence pair (repeatable)")
    p.add_argument("--tsv", type=Path, help="a TSV of inputs (the task's GLUE columns with a header, or headerless)")
    p.add_argument("--task", help="the task to predict (a multi-task model has several)")
    p.add_argument("--out", type=Path, help="write the TSV here instead of stdout (a new file, or --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="let --out replace a file that exists")
    p.add_argument("--tracking-uri", help="the MLflow store of a run id (default: the one the runs go to)")
    p.add_argument("--batch-size", type=int, help="default: the run's train.eval_batch_size")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if there is one)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let Python code shipped with the model's tokenizer run (a model folder cannot ask for it)")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    a = parse(argv)
    try:
        from deepen_run.data.glue import TASKS
        from deepen_run.serve import table
        from deepen_run.serve.loading import build, open_model
        from deepen_run.serve.table import pick_task, split_inputs  # no torch: refusals stay cheap

        folder, cfg, info = open_model(a.run, a.tracking_uri, a.trust_remote_code)
        spec = pick_task({t: TASKS[t] for t in info["tasks"]}, a.task)
        texts, idx = list(a.texts) + [tuple(x) for x in a.pair], None
        texts = [t if isinstance(t, tuple) or "\t" not in t else tuple(t.split("\t")) for t in texts]
        if a.tsv is not None:
            if texts:
                raise UserError("give sentences as arguments or --tsv, not both")
            idx, texts = table.read_tsv(a.tsv, spec)
        elif not texts:
            if sys.stdin.isatty():
                raise UserError("no input: give sentences, --pair A B, --tsv FILE, or lines on stdin")
            texts = table.read_stdin(sys.stdin.buffer)
        if not texts:
            raise UserError(f"no input: {a.tsv or 'stdin'} holds no rows to predict")
        split_inputs(texts, spec)  # a pair for a one-sentence task: refused before the weights load
        table.check_out(a.out, a.overwrite)
        if a.batch_size is not None and a.batch_size <= 0:
            raise UserError(f"--batch-size {a.batch_size} must be positive")
        if a.device is not None:
            from deepen_run.serve.predictor import pick_device

            pick_device(a.device)  # torch, but no weights yet
        from deepen_run.run.progress import quiet_libraries

        quiet_libraries()  # off a terminal (a pipe, a log): no "Loading weights" bar
        model = build(folder, cfg, info, device=a.device)
        preds = model.predict(texts, spec.name, a.batch_size)
        table.write(table.rows(spec, idx if idx is not None else list(range(len(texts))), preds,
                               getattr(model.model, "extra_columns", {})), a.out)
        if a.out is not None:
            print(f"wrote {len(preds)} predictions to {a.out}", file=sys.stderr)
    except UserError as e:
        fail_with(e, prog="deepen-predict")


if __name__ == "__main__":
    main()
