"""Third-party modules mindformers imports at its top level for features our processes never call, loaded when
first used instead.

`import mindformers` imports, through `mindformers.core.metric.metric` and
`mindformers.dataset.dataloader.hf_dataloader`, Hugging Face `datasets` (with pandas, pyarrow, aiohttp, fsspec),
nltk's BLEU, jieba and rouge_chinese: ~40% of its import time here (tiny trainer, CPU, 2 cores: ~3 s of ~7 s).
Our trainers read MindRecord and score no text metrics, so these imports are pure start-up cost, paid by every
trainer, evaluation and export launch.

`import_mindformers()` imports mindformers that way (the trainer entry, the export worker and
model.llama.build_llama call it before their `from mindformers import ...`). Under it, `deferring()`: inside that
block each module of DEFERRED is a placeholder in `sys.modules`; a name taken from it
(`from nltk.translate.bleu_score import sentence_bleu`, `jieba.cut`) is a stand-in that imports the real module
the first time it is called or an attribute of it is read. After the block, reading an attribute of a placeholder
imports the real module and returns the real attribute, so later code
(`isinstance(x, datasets.Dataset)`, `from datasets import Dataset` in a function) sees the real objects.

Why this is safe for mindformers 1.9.0 (the pinned version, checked when DEFERRED was written): every use of
these names in those two files is inside a function body (metric computation, the HF data loader), none at
module level, and no class derives from them. A name that were used at import time (a base class, an
`isinstance` during import) would be a stand-in, not a class: `tests/runtime/test_deferred_imports.py` imports
mindformers under `deferring()` in a fresh process, checks that none of the real modules loaded, and calls
through the stand-ins. Another mindformers version must pass that test before it is pinned.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from contextlib import contextmanager

# the modules mindformers imports at its top level for metrics and Hugging Face datasets (see the docstring)
DEFERRED = ("datasets", "datasets.distributed", "nltk", "nltk.translate", "nltk.translate.bleu_score", "jieba",
            "rouge_chinese")

_lock = threading.RLock()
_windows_open = 0  # deferring() blocks running now: one may run inside another


def _real(name: str) -> types.ModuleType:
    """The real module `name`: the placeholders of its package leave sys.modules and the import runs."""
    with _lock:
        current = sys.modules.get(name)
        if current is not None and not isinstance(current, _Placeholder):
            return current
        root = name.split(".")[0]
        for key in [k for k, v in sys.modules.items() if isinstance(v, _Placeholder) and k.split(".")[0] == root]:
            del sys.modules[key]
        return importlib.import_module(name)


class _StandIn:
    """A name taken from a placeholder while the window was open: the real object on first call or attribute."""

    def __init__(self, module: str, attr: str):
        object.__setattr__(self, "_where", (module, attr))

    def _target(self):
        module, attr = object.__getattribute__(self, "_where")
        return getattr(_real(module), attr)

    def __call__(self, *args, **kwargs):
        return self._target()(*args, **kwargs)

    def __getattr__(self, attr: str):
        return getattr(self._target(), attr)

    def __repr__(self) -> str:
        module, attr = object.__getattribute__(self, "_where")
        return f"<deferred {module}.{attr}>"


class _Placeholder(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if _windows_open:
            return _StandIn(self.__name__, attr)
        return getattr(_real(self.__name__), attr)


def _spec(name: str):
    """The real module's spec, found without running it (importlib.util.find_spec on a placeholder's name must
    still answer, e.g. a library asking whether `datasets` is installed)."""
    parent, _, _ = name.rpartition(".")
    if not parent:
        return importlib.util.find_spec(name)
    parent_spec = _spec(parent)
    locations = parent_spec.submodule_search_locations if parent_spec else None
    return importlib.machinery.PathFinder.find_spec(name, locations) if locations else None


@contextmanager
def deferring(names: tuple[str, ...] = DEFERRED):
    """Placeholders for `names` (those installed and not yet imported) while the block imports."""
    global _windows_open
    placed = []
    with _lock:
        for name in names:
            if name in sys.modules:
                continue
            spec = _spec(name)
            if spec is None:  # not installed: the import fails as it would have
                continue
            module = _Placeholder(name)
            module.__spec__ = spec
            sys.modules[name] = module
            placed.append(name)
        _windows_open += 1
    try:
        yield placed
    finally:
        with _lock:
            _windows_open -= 1


def import_mindformers() -> types.ModuleType:
    """`import mindformers` without loading DEFERRED (a no-op once it is imported)."""
    with deferring():
        import mindformers
    return mindformers


def loaded(name: str) -> bool:
    """Whether the real module `name` has been imported (not only its placeholder)."""
    module = sys.modules.get(name)
    return module is not None and not isinstance(module, _Placeholder)
