"""The one exception type for mistakes a user can make (bad config, bad input, missing tool).

A ``UserError`` is printed as a single line without a traceback; anything else is a bug and
keeps its traceback.
"""


class UserError(Exception):
    """A problem the user can fix: the message names what is wrong and how to fix it."""

    def __init__(self, message: str, *, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
