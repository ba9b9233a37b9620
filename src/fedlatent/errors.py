"""Errors that mean "the user's input is wrong": the CLI turns them into one line and exit code 2."""


class UserInputError(Exception):
    """Invalid configuration, data or arguments (exit code 2, no traceback)."""


class ConfigError(UserInputError):
    """A configuration key has an invalid value; the message names the key and what is allowed."""


class DataError(UserInputError):
    """Data on disk is missing or malformed; the message names the file or folder expected."""
