"""Exception types for what the user can fix; the CLI prints them as one line."""


class UserError(Exception):
    """Bad input: the message names the culprit and how to fix it."""

    exit_code = 2


class NonFiniteLoss(UserError):
    """Training diverged (NaN/inf loss): the run ends FAILED with this message, exit code 1."""

    exit_code = 1
