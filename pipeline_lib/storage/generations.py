"""A value on a store that several processes update at once without losing an update.

The value lives in a folder as numbered generations `g0000000001<suffix>`, `g0000000002<suffix>`, ...;
the newest is the current value. An update reads the newest (generation N), writes its next value
and creates generation N+1 with `store.put_new` (create only if absent: os.link locally,
If-None-Match: * on S3). When another writer created N+1 first, put_new says so and the update
starts again from the new newest generation (merge, retry; bounded). No lock, no lease: a writer
that dies leaves at most a temp file. Old generations are pruned after a successful update (the
previous one stays, so a reader that listed it a moment ago can still read it).

Raises: CommitConflict when every attempt lost to a concurrent writer (the message says which
value and how many attempts).
"""
from __future__ import annotations

import random
import re
import tempfile
import time
from pathlib import Path
from typing import Callable

from .store import join

GEN = re.compile(r"g(\d{10})(\.[A-Za-z0-9]+)?$")
ATTEMPTS = 12


class CommitConflict(RuntimeError):
    """Every attempt to write the next generation lost to a concurrent writer."""


def gen_uri(folder: str, gen: int, suffix: str = "") -> str:
    return join(folder, f"g{gen:010d}{suffix}")


def list_generations(store, folder: str) -> list[tuple[int, str]]:
    """(generation, uri) of every generation under `folder`, oldest first."""
    found = []
    for uri in store.list(folder.rstrip("/") + "/"):
        name = uri.rsplit("/", 1)[-1]
        m = GEN.fullmatch(name)
        if m and join(folder, name) == uri:  # direct children only
            found.append((int(m.group(1)), uri))
    return sorted(found)


def latest(store, folder: str) -> tuple[int, str | None]:
    """(generation, uri) of the current value; (0, None) when there is none yet."""
    gens = list_generations(store, folder)
    return gens[-1] if gens else (0, None)


def update(store, folder: str, write_next: Callable[[str | None, Path], None], *, suffix: str = "",
           attempts: int | None = None, after_read: Callable[[], None] | None = None) -> int:
    """Write the next generation of the value in `folder`: `write_next(current uri or None, path)`
    writes the new value to the local `path` from the current one. Returns the generation written.
    after_read: called between reading and writing (tests use it to make two writers collide)."""
    attempts = attempts or ATTEMPTS
    for attempt in range(attempts):
        gen, current = latest(store, folder)
        with tempfile.TemporaryDirectory(prefix="gen-") as tmp:
            out = Path(tmp) / "next"
            try:
                write_next(current, out)
            except FileNotFoundError:  # pruned by a concurrent writer between list and read
                continue
            if after_read:
                after_read()
            if store.put_new(gen_uri(folder, gen + 1, suffix), out):
                prune(store, folder, keep_from=gen)
                return gen + 1
        time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))  # two losers do not collide again in lockstep
    raise CommitConflict(f"{folder}: {attempts} attempts to write generation after {gen} all lost to concurrent "
                         "writers (another run is committing to the same place right now); nothing was changed "
                         "by this attempt. Fix: run it again once the other run has finished")


def prune(store, folder: str, keep_from: int) -> None:
    """Delete generations older than `keep_from` (ignoring ones another writer already deleted)."""
    for gen, uri in list_generations(store, folder):
        if gen < keep_from:
            try:
                store.delete(uri)
            except FileNotFoundError:
                pass


def read_bytes(store, folder: str) -> bytes | None:
    """The current value's bytes, None when there is none (retries when it is pruned mid-read)."""
    for _ in range(ATTEMPTS):
        _, uri = latest(store, folder)
        if uri is None:
            return None
        try:
            return store.get_bytes(uri)
        except FileNotFoundError:
            continue
        except Exception as err:  # S3: NoSuchKey
            if "NoSuchKey" not in str(err):
                raise
    raise CommitConflict(f"{folder}: the current generation kept disappearing while being read")
