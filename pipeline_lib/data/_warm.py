"""Preloaded by the worker pool's fork server: import the stage and build the per-process tables
once, so that every forked worker starts with them."""
from . import stage  # noqa: F401
from .minhash import _char_classes, permutations

_char_classes()
permutations(128)
