"""What a sweep's parent row shows in the runs table, collapsed.

The table's default columns are tags (deepen_run/tracking/ui.py): `score`, the swept keys, method,
task, backbone, ... A parent trains nothing, so without tags of its own its row read "-" in every
column and a person had to unfold it to see anything. Its tags now summarise its children: `score`
is the best child's score and how many children it is of (`best <score> (<k> of <n> runs)`), and every
other default column holds the children's values (`seed` 1,2 for a sweep over seed=1,2), the same tag names,
so the collapsed row reads as the sweep. Rebuilt with the run note as each job ends (summary.update).

Only the runs table reads these tags: deepen-report leaves parents out of its rows (report/rows.py
reportable) and finds a sweep's runs by sweep_id and sweep_role, never by these tags.
"""
from __future__ import annotations

from deepen_run.run.names import SCORE_TAG
from deepen_run.tracking.ui import LAST

# The runs table's default tag columns besides `score` and the swept keys: ui.LAST's, by tag name.
SHOWN = tuple(c.removeprefix("tags.`").removesuffix("`") for c in LAST)


def _joined(values: list[str]) -> str:
    """Distinct values, numbers in numeric order (seeds 1,2,10), others as the children came."""
    distinct = list(dict.fromkeys(values))
    try:
        distinct.sort(key=float)
    except ValueError:
        pass
    return ",".join(distinct)


def parent_tags(children: list[dict], swept_keys: list[str], n_jobs=None) -> dict[str, str]:
    """The parent's tags for its collapsed row, from its children (tracking.find_runs dicts)."""
    tags = {}
    for key in dict.fromkeys([*swept_keys, *SHOWN]):
        values = [c["tags"][key] for c in children if key in c["tags"]]
        if values:
            tags[key] = _joined(values)
    scores = [float(c["tags"][SCORE_TAG]) for c in children
              if c["status"] == "FINISHED" and SCORE_TAG in c["tags"]]
    if scores:
        tags[SCORE_TAG] = f"best {max(scores):.4f} ({len(scores)} of {n_jobs or len(children)} runs)"
    return tags
