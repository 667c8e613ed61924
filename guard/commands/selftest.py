"""Not built yet."""

from guard.errors import UsageError


def add_arguments(parser):
    pass


def run(args) -> int:
    raise UsageError("not implemented yet")
