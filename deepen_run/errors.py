"""Exception types for what the user can fix, and how a command prints one: a single line, then exit.
fail/fail_with sit here, not in the CLI, so the run layer (run/rundir.py) can end a command too."""
from __future__ import annotations

import sys

from deepen_run.util import one_line


class UserError(Exception):
    """Bad input: the message names the culprit and how to fix it."""

    exit_code = 2


class NonFiniteLoss(UserError):
    """Training diverged (NaN/inf loss): the run ends FAILED with this message, exit code 1."""

    exit_code = 1


class FromRun(Exception):
    """A Hydra or OmegaConf error the run itself raised (a bug: shown with its traceback), carried
    past a CLI's handler of the same types from composition (bad input: one line)."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


def fail(msg: str, code: int, newline: bool = False, prog: str = "deepen-run") -> None:
    # newline: a progress bar may hold the cursor mid-line; the message gets a line of its own.
    from deepen_run.masking import mask_string, secret_env_values  # a URI's password, a token: never shown

    print(f"{chr(10) if newline else ''}{prog}: error: {one_line(mask_string(str(msg), secret_env_values()))}",
          file=sys.stderr)
    sys.exit(code)


def fail_with(e: UserError, prog: str = "deepen-run") -> None:
    fail(str(e), getattr(e, "exit_code", 2), newline=isinstance(e, NonFiniteLoss), prog=prog)


PRIMARY = ("config", "probe")  # the commands' own configs (conf/config.yaml, conf/probe.yaml)


def composition_line(e: Exception, overrides: list[str] = ()) -> str:
    """Hydra's or OmegaConf's composition error, said in the command's own terms: an unknown group
    option lists the options (not Hydra's config search path), a value of the wrong type names the
    override it came from. overrides: the command's."""
    import re

    from hydra.errors import MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(e, MissingConfigException) and e.options:
        missing = str(e.missing_cfg_file)
        # The group of the override that named it, the longest that fits (an option may hold a slash:
        # backbone=minilm/nope; hydra/launcher=...), else the path's last part is the option
        groups = [k.lstrip("+~").split("@")[0] for k, _, _ in (o.partition("=") for o in overrides)]
        typed = max((g for g in groups if missing.startswith(g + "/")), key=len, default=None)
        group, name = (typed, missing[len(typed) + 1:]) if typed else missing.rpartition("/")[::2]
        # Hydra's "In '<config>'": worth saying where a config file's own defaults list named it
        parent = re.match(r"In '([^']+)': ", str(e))
        where = parent[0] if parent and parent[1] not in PRIMARY and not typed else ""
        return f"{where}{group}={name}: no such {group}; choose one of: {', '.join(e.options)}"
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
    merging = "Error merging override "
    # OmegaConf's msg: its reason, then lines of node information (full_key: ...)
    reason = next((ln for ln in str(getattr(cause, "msg", "") or "").splitlines() if ln.strip()), "")
    if str(e).startswith(merging) and reason and not reason.lstrip().startswith("full_key:"):
        return f"{str(e)[len(merging):]}: {reason.strip()}"
    return f"{e} {one_line(cause) if cause else ''}"
