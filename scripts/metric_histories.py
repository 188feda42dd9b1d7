"""Every metric's full history from an MLflow store, as JSON; or the comparison of two such dumps.

A refactor that must not change results is checked with it: run the same fixed-seed commands
before and after, dump each store, compare. Wall-clock metrics (names ending in `_s`: runtime,
step time) differ between any two runs and are left out of the comparison by default.

    python scripts/metric_histories.py dump sqlite:////tmp/ref.db --out /tmp/ref.json
    python scripts/metric_histories.py compare /tmp/ref.json /tmp/new.json
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from deepen_run.util import sqlite_path


def dump(uri: str) -> dict:
    """run name -> metric -> [[step, value], ...] in step order, for every run of every experiment."""
    from mlflow.tracking import MlflowClient  # only to dump: comparing needs no MLflow

    client = MlflowClient(tracking_uri=uri)
    out: dict = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], max_results=50000, order_by=["attributes.start_time ASC"]):
            # Runs of one name (a command run twice) are told apart by their order, not overwritten.
            name = key = f"{exp.name}/{run.info.run_name}"
            while key in out:
                key = f"{name}#{int(key.rpartition('#')[2]) + 1 if key != name else 2}"
            out[key] = {m: [[h.step, h.value] for h in sorted(client.get_metric_history(run.info.run_id, m),
                                                               key=lambda h: (h.step, h.timestamp))]
                        for m in sorted(run.data.metrics)}
    return out


def compare(a: dict, b: dict, ignore: str) -> list[str]:
    """The differences, one line each; empty = bit-identical (values compared with ==, NaN = NaN)."""
    skip = re.compile(ignore)
    diffs = [f"run only in one dump: {k}" for k in sorted(set(a) ^ set(b))]
    for run in sorted(set(a) & set(b)):
        for m in sorted(set(a[run]) | set(b[run])):
            if skip.search(m):
                continue
            x, y = a[run].get(m), b[run].get(m)
            if x != y and json.dumps(x) != json.dumps(y):  # json: NaN == NaN
                diffs.append(f"{run} {m}: {x} != {y}")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("uri")
    d.add_argument("--out", default="-")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--ignore", default=r"_s$", help="regex of metric names left out (default: wall-clock ones)")
    args = ap.parse_args()
    if args.cmd == "dump":
        db = sqlite_path(args.uri)
        if db is not None and not db.is_file():  # MLflow would make an empty store, and its dump compares equal
            ap.error(f"{args.uri}: no such database")
        text = json.dumps(dump(args.uri), indent=1, sort_keys=True)
        if args.out == "-":
            print(text)
        else:
            with open(args.out, "w") as f:
                f.write(text)
        return 0
    with open(args.a) as fa, open(args.b) as fb:
        a, b = json.load(fa), json.load(fb)
    if not a and not b:
        ap.error("both dumps hold no run: nothing was compared")
    diffs = compare(a, b, args.ignore)
    print("\n".join(diffs) if diffs else "bit-identical")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
