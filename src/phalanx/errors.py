"""Errors shared by every part of Phalanx."""


class UserFacingError(Exception):
    """An error whose message is the whole story for the user: printed without a traceback."""
