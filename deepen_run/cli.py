"""`deepen-run`: the Hydra entry point. Bad input prints one line and exits 2."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402

from deepen_run.config import ROOT, register  # noqa: E402
from deepen_run.errors import UserError  # noqa: E402

register()


@hydra.main(version_base=None, config_path=str(ROOT / "conf"), config_name="config")
def main(cfg) -> float:
    from deepen_run.runner import run

    try:
        return run(cfg)
    except UserError as e:
        print(f"deepen-run: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
