"""One exception type for mistakes the user can fix; the CLI prints it as one line."""


class UserError(Exception):
    """Bad input: the message names the culprit and how to fix it."""
