"""Preloaded by the worker pool's fork server: import the stage and build the per-process tables
once, so that every forked worker starts with them."""
import pyarrow as pa

from . import stage  # noqa: F401
from .filters import char_flags
from .minhash import lsh_params, permutations
from .tokenhash import char_classes

char_classes()
char_flags()
permutations(128)
lsh_params(0.8, 128)
pa.array(["x"])  # pyarrow imports pandas on first use: do it here, once
