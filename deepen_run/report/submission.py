"""`deepen-report --submission FILE.zip`: the GLUE leaderboard zip from the submission/ files that
predict=true runs logged (deepen_run/run/submission.py writes them), for runs of one task each."""
from __future__ import annotations

import tempfile
from pathlib import Path

from deepen_run.data.glue import AX, DIAGNOSED_BY, TASKS
from deepen_run.run.submission import missing_line, zip_bytes
from deepen_run.tracking.store import artifact_files, artifact_text


def gather(runs: list[dict], uri: str, out, score) -> tuple[dict[str, str], str]:
    """deepen-report --submission: per server file, the FINISHED run (of `runs`) that logged it with
    the best dev score of its task (AX: of MNLI); writes the zip to `out`. -> (stem -> run name, the
    missing line). score(metrics, task): a run's dev score of a task (report.main.task_value)."""
    task_of = {stem: t.name for t in TASKS.values() for stem in t.submission} | {AX.submission[0]: DIAGNOSED_BY}
    best: dict[str, tuple] = {}
    for r in runs:
        if r["status"] != "FINISHED":
            continue
        for path in artifact_files(uri, r["run_id"], "submission"):
            stem = Path(path).stem
            if path.endswith(".tsv") and stem in task_of:
                value = score(r["metrics"], task_of[stem])
                key = (value if value is not None else float("-inf"), r["run_id"])
                if stem not in best or key[0] >= best[stem][0][0]:  # ties: the later run
                    best[stem] = (key, r, path)
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for stem, (_, r, path) in best.items():
            files[stem] = artifact_text(uri, r["run_id"], path, tmp)
    if files:  # nothing to write: the path is left as it was (main says why)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_bytes(zip_bytes(files))
    return {stem: best[stem][1]["name"] for stem in files}, missing_line(files)
