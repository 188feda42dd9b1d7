"""`deepen-export RUN DIR`: a trained model as a self-describing folder (docs/use-a-model.md):
weights (safetensors), config, tokenizer and a model card; a plain classifier loads with
transformers' AutoModelForSequenceClassification, any model with deepen_run.load(DIR)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Optional

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from deepen_run.errors import UserError, fail_with  # noqa: E402


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="deepen-export", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run id, run folder, models:/ URI or an export folder")
    p.add_argument("dir", type=Path, help="the folder to write (new, empty, or an earlier export)")
    p.add_argument("--tracking-uri", help="the MLflow store of a run id (default: the one the runs go to)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let Python code shipped with the model's tokenizer run (a model folder cannot ask for it)")
    a = p.parse_args(argv)
    try:
        from deepen_run.serve.export import export

        from deepen_run.run.progress import quiet_libraries

        quiet_libraries()  # off a terminal: no "Loading weights" / "Writing model shards" bars in a log
        dest, hf_class = export(a.run, a.dir, a.tracking_uri, a.trust_remote_code)
        how = f"transformers' AutoModelForSequenceClassification ({hf_class}) or deepen_run.load" if hf_class \
            else "deepen_run.load (see its README.md for why)"
        print(f"exported to {dest}: loads with {how}")
    except UserError as e:
        fail_with(e, prog="deepen-export")


if __name__ == "__main__":
    main()
