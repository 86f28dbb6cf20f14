"""The one exception type for bad user input.

Library code raises `UserError` with a message a user can act on; the CLI prints it as one line and
exits with code 2. Anything else that escapes is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input (missing file, bad YAML, unknown objective, ...): one clear line, exit code 2."""
