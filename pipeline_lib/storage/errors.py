"""Errors that cross process boundaries intact.

An exception raised in a pool worker or a Dask worker is pickled back to the stage process. Python pickles an
exception as `type(err)(*err.args)`: a class whose __init__ takes other arguments than its message (field,
value, problem, fix) cannot be rebuilt, and the stage then shows `BrokenProcessPool ... terminated abruptly`
instead of the message and its fix. `PicklableError`, mixed in first, rebuilds the exception from its message
args and its attributes without calling __init__. Attributes that cannot be pickled (a live client) are the
class's business: list them in `_not_pickled`.
"""
from __future__ import annotations


def _rebuild(cls, args: tuple, state: dict):
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(state)
    return err


class PicklableError:
    """Mixin for an exception class with its own __init__ (e.g. `class DataStageError(PicklableError, ValueError)`)."""

    _not_pickled: tuple[str, ...] = ()

    def __reduce__(self):
        state = {k: v for k, v in self.__dict__.items() if k not in self._not_pickled}
        return _rebuild, (type(self), self.args, state)
