"""Errors that mean "the user's input is wrong": the CLI turns them into one line and exit code 2."""


class UserInputError(Exception):
    """Invalid configuration, data or arguments (exit code 2, no traceback)."""


class ConfigError(UserInputError):
    """A configuration key has an invalid value; the message names the key and what is allowed."""


class DataError(UserInputError):
    """Data on disk is missing or malformed; the message names the file or folder expected."""


class RunStopped(RuntimeError):
    """The failure policy ended the run early (exit code 1); ``str()`` is the one-line reason
    (round, client, quantity) and ``rounds_completed`` the rounds whose checkpoints were written."""

    def __init__(self, reason: str, rounds_completed: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rounds_completed = rounds_completed
