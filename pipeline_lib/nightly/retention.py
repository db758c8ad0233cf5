"""Bounded disk: what the run folders of decided nights keep (nightly.retention), and removing the rest safely.

Every night leaves <output_root>/<run_id>/. Three kinds of its files are large and lose their use as nights pass:
  weights               pretrain/checkpoint/merged/   the weights-only checkpoint (27 GB at the shipped 7B layout):
                        kept for the newest `keep_promoted` promoted nights (`latest` always) and for a held
                        candidate during `held_days` days (a person may still promote it)
  training checkpoints  pretrain/checkpoint/rank_*/ + checkpoint_optimizer/rank_*/   per rank, the weights and their
                        AdamW moments (81 GB a checkpoint at 7B, keep_checkpoint_max of them): kept only for the
                        newest decided night that trained
  data                  data/cleaned/, data/mindrecord/   the cleaned text and packed rows: kept for the nights replay
                        reads (`replay_nights_kept`), none with replay off
Never removed: whatever the nightly state or the config points at (`latest`'s checkpoint and tokenizer, a kept held
candidate's, the lineage's fixed held-out split `reference_heldout`, evaluate.reference_heldout,
model.base_checkpoint, evaluate.compare_checkpoints, tokenizer.path), tokenizers, logs, metrics, manifests, stats,
evaluation outputs, changes.md: a night's small files stay, so `status`, `diff` and the summaries still read it.
Only nights in the state's history (decided) are looked at; a night not there (running, or failed and resumable)
and the night holding the nightly lock are untouched.

`plan_retention` decides from the state and the folders' listings alone (pure). `gc(cfg, dry_run)` lists the folders
(never following a symbolic link: a link is reported, not followed, not removed), plans, and with dry_run=False:
  1. records the intent in the state (one conditional write, re-planned on the newest state: only what both plans
     say is removed, so a night committed or promoted meanwhile is never hurt); an expired held candidate leaves
     `held` there, so it can no longer be promoted onto removed weights;
  2. per night writes `<run>/retention.json` (the tombstone: what is removed, when, why), then removes each planned
     file after checking it is still that file: locally opened directory by directory from the output root with
     O_NOFOLLOW (a symbolic link anywhere on the way is refused) and removed only if it is a regular file of the
     planned size; on S3 only the planned keys under the run's prefix, with their planned sizes;
  3. records what was freed in the state's `retention` list (one entry per pass) and in the tombstone.
The stage manifests stay: a manifest whose outputs retention removed reads as done through `removed_by_retention`.
"""
from __future__ import annotations

import datetime as dt
import errno
import json
import os
import re
import stat
from dataclasses import dataclass, field

from ..config.schema import PipelineConfig, RetentionConfig
from ..storage.sizes import size_text
from ..storage import RunPaths, join, store_for
from .state import promoted_nights, update_state

WEIGHTS, TRAINING, DATA = "weights", "training checkpoints", "data"
KINDS = (TRAINING, WEIGHTS, DATA)
TOMBSTONE = "retention.json"
STATE_ENTRIES_KEPT = 400  # the state's `retention` list: about a year of nightly passes (the state is read nightly)
_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")


def kind_of(rel: str) -> str | None:
    """The kind of a file by its path in the run folder, None for what is always kept."""
    parts = rel.split("/")
    if parts[:3] == ["pretrain", "checkpoint", "merged"] and len(parts) > 3:
        return WEIGHTS
    # a training checkpoint is its weights (checkpoint/rank_N) + its optimizer state (checkpoint_optimizer/rank_N,
    # train.checkpoint_split): both go together
    if parts[:2] in (["pretrain", "checkpoint"], ["pretrain", "checkpoint_optimizer"]) and len(parts) > 3 \
            and parts[2].startswith("rank_"):
        return TRAINING
    if parts[0] == "data" and len(parts) > 2 and parts[1] in ("cleaned", "mindrecord"):
        return DATA
    return None


@dataclass
class Folder:
    """A run folder as listed: regular files (path relative to the run folder -> bytes) and the symbolic links met
    (never followed). `linked`: the run folder itself is a link (nothing in it is touched)."""

    files: dict[str, int] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)
    linked: bool = False


@dataclass
class NightPlan:
    run_id: str
    decision: str
    remove: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> {rel path: bytes}
    why: dict[str, str] = field(default_factory=dict)                # kind -> why it goes, or why it stays
    pinned: dict[str, str] = field(default_factory=dict)             # kind -> what points at the files kept of it
    links: list[str] = field(default_factory=list)

    def bytes(self, kind: str | None = None) -> int:
        return sum(sum(f.values()) for k, f in self.remove.items() if kind in (None, k))

    def files(self) -> dict[str, int]:
        return {rel: size for f in self.remove.values() for rel, size in f.items()}


@dataclass
class Plan:
    output_root: str
    made_at: str
    nights: list[NightPlan]
    untouched: dict[str, str]              # run id -> why it is not looked at
    expire_held: list[str]                 # held candidates whose weights go: they leave `held`
    folders: dict[str, Folder] = field(default_factory=dict, repr=False)
    unsampled: list[str] = field(default_factory=list)  # nights whose cleaned text the data screen has yet to sample

    @property
    def total(self) -> int:
        return sum(n.bytes() for n in self.nights)

    def night(self, run_id: str) -> NightPlan | None:
        return next((n for n in self.nights if n.run_id == run_id), None)


def _age_days(entry: dict, now: dt.datetime) -> float | None:
    """Days since a held night ended (its `finished_at`, else the date in its run id); None when unknown."""
    when = None
    if entry.get("finished_at"):
        try:
            when = dt.datetime.fromisoformat(entry["finished_at"])
        except ValueError:
            when = None
    if when is None:
        found = _DATE.search(entry.get("run_id", ""))
        if not found:
            return None
        when = dt.datetime.fromisoformat(found.group(1) + "T00:00:00+00:00")
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return (now - when).total_seconds() / 86400


def held_kept(policy: RetentionConfig, state: dict, now: dt.datetime) -> tuple[dict[str, str], list[str]]:
    """({held run id: why kept}, [held run ids past held_days]) of the state's `held` list."""
    kept, expired = {}, []
    for entry in state.get("held") or []:
        age = _age_days(entry, now)
        if age is None:
            kept[entry["run_id"]] = "held, its age unknown: kept"
        elif age <= policy.held_days:
            kept[entry["run_id"]] = f"held {age:.1f} of nightly.retention.held_days={policy.held_days:g} days"
        else:
            expired.append(entry["run_id"])
    return kept, expired


def replay_nights_kept(policy: RetentionConfig, state: dict, replay_on: bool) -> list[str]:
    """The promoted nights whose packed rows replay reads tonight (and retention keeps), oldest first: the newest
    nightly.retention.replay_nights of them (all when null); none with replay off."""
    if not replay_on:
        return []
    promoted = promoted_nights(state)
    return promoted[-policy.replay_nights:] if policy.replay_nights else promoted


def _rel_in_root(uri: str, output_root: str) -> str | None:
    """`<run_id>/<path>` of a URI under the output root, else None (a path elsewhere pins nothing of ours)."""
    if not uri:
        return None
    uri, root = str(uri), str(output_root)
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if not root.startswith("s3://"):
        # as written and with links resolved: a state written through a linked output root still pins its files
        for form in (os.path.abspath, os.path.realpath):
            u, r = os.path.normpath(form(uri)), os.path.normpath(form(root))
            if u.startswith(r + os.sep):
                return os.path.relpath(u, r).replace(os.sep, "/")
        return None
    root = root.rstrip("/") + "/"
    return uri[len(root):].strip("/") if uri.startswith(root) else None


def pinned_uris(state: dict, config_uris: list[str] = (), keep_held: list[str] = (),
                kept_weights: list[str] = ()) -> dict[str, str]:
    """{URI: what points at it}: never removed (latest's checkpoint and tokenizer, the kept held candidates',
    reference_heldout, and the config's own references)."""
    pins = {}
    latest = state.get("latest") or {}
    for key in ("checkpoint", "tokenizer"):
        if latest.get(key):
            pins[latest[key]] = f"latest's {key}"
    if state.get("reference_heldout"):
        pins[state["reference_heldout"]] = "the lineage's fixed held-out split (reference_heldout)"
    for entry in state.get("held") or []:
        if entry["run_id"] in keep_held:
            for key in ("checkpoint", "tokenizer"):
                if entry.get(key):
                    pins[entry[key]] = f"a kept held candidate's {key}"
    # any other path the nightly's parts keep on `latest` or a kept held candidate (commit_night's `record`)
    for where, entry in [("latest", latest)] + [("a kept held candidate", h) for h in state.get("held") or []
                                                if h["run_id"] in keep_held]:
        for uri in _paths_in(entry):
            pins.setdefault(uri, f"named on {where} in the nightly state")
    for uri in kept_weights:
        pins.setdefault(uri, "a kept night's weights (the state's history names them)")
    for uri in config_uris:
        pins.setdefault(uri, "named in the config")
    return pins


def _paths_in(value) -> list[str]:
    """Absolute paths and s3:// URIs anywhere in a state record (its nested dicts and lists)."""
    from ..storage import is_absolute

    if isinstance(value, str):
        return [value] if is_absolute(value) else []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [p for item in items for p in _paths_in(item)]


def plan_retention(policy: RetentionConfig, state: dict, folders: dict[str, Folder | None], *, output_root: str,
                   now: dt.datetime, running: str | None = None, replay_on: bool = False,
                   config_uris: list[str] = (), replay_runs: list[str] = (), unsampled: list[str] = ()) -> Plan:
    """What to remove from the folders of the decided nights (see the module docstring). `folders`: run id -> its
    listing (None: no folder); `running`: the run id holding the nightly lock; `config_uris`: paths the config names
    (never removed); `replay_runs`: data.replay.runs configured (their data is kept while replay is on);
    `unsampled`: promoted nights the data screen has not sampled yet (it reads their cleaned text: screen_sample)."""
    promoted = promoted_nights(state)
    latest = (state.get("latest") or {}).get("run_id")
    newest_promoted = promoted[-policy.keep_promoted:]
    held, expired = held_kept(policy, state, now)
    replayed = set(replay_nights_kept(policy, state, replay_on)) | (set(replay_runs) if replay_on else set())
    # the file the state names as a kept night's weights, wherever it lies (an earlier version's rank file too)
    kept_weights = [n["checkpoint"] for n in state.get("history") or []
                    if n.get("checkpoint") and (n["run_id"] in newest_promoted or n["run_id"] in held)]
    pins = {rel: why for uri, why in pinned_uris(state, config_uris, list(held), kept_weights).items()
            if (rel := _rel_in_root(uri, output_root))}
    decided: dict[str, str] = {}
    for night in state.get("history") or []:
        decided[night["run_id"]] = night.get("decision") or ("promoted" if night.get("checkpoint") else "?")
    with_weights = {n["run_id"] for n in state.get("history") or [] if n.get("checkpoint")}
    trained = [r for r in decided if r in with_weights or r in promoted or r in held or r in expired]
    newest_trained = trained[-1] if trained else None

    def verdict(run_id: str, kind: str) -> tuple[bool, str]:
        """(remove?, why)"""
        if kind == WEIGHTS:
            if run_id == latest:
                return False, "latest"
            if run_id in newest_promoted:
                return False, f"one of the newest nightly.retention.keep_promoted={policy.keep_promoted} promoted"
            if run_id in held:
                return False, held[run_id]
            if run_id in expired:
                return True, f"held longer than nightly.retention.held_days={policy.held_days:g} days"
            if run_id in promoted:
                return True, f"promoted, older than the newest keep_promoted={policy.keep_promoted}"
            return True, f"not promoted ({decided[run_id]})"
        if kind == TRAINING:
            if run_id == newest_trained:
                return False, "the newest night's (what a resume needs)"
            return True, "optimizer state is kept for the newest night only"
        if run_id in replayed:
            return False, "replay reads it (data.replay, nightly.retention.replay_nights)"
        if run_id in held:
            return False, "held: a promotion by hand reads it (the screen's sample; replay)"
        if run_id in unsampled:
            return False, "the data screen has not sampled its accepted documents yet"
        if not replay_on:
            return True, "replay is off, data.replay.fraction 0: nothing reads it"
        return True, "replay does not read it (not among the promoted nights replay reads)"

    nights, untouched = [], {}
    for run_id, decision in decided.items():
        if run_id == running:
            untouched[run_id] = "holds the nightly lock (running)"
            continue
        folder = folders.get(run_id)
        if folder is None:
            continue
        if folder.linked:
            untouched[run_id] = "its run folder is a symbolic link: not followed"
            continue
        plan = NightPlan(run_id, decision, links=list(folder.links))
        for rel, size in sorted(folder.files.items()):
            kind = kind_of(rel)
            if kind is None:
                continue
            full = f"{run_id}/{rel}"
            pinned = next((why for p, why in pins.items() if full == p or full.startswith(p + "/")), None)
            remove, why = verdict(run_id, kind)
            if pinned:
                plan.pinned.setdefault(kind, pinned)
                if not remove:
                    plan.why[kind] = why
                continue
            plan.why[kind] = why
            if remove:
                plan.remove.setdefault(kind, {})[rel] = size
        nights.append(plan)
    return Plan(str(output_root), now.isoformat(), nights, untouched, sorted(expired), dict(folders), list(unsampled))


# ------------------------------------------------------------------ the folders, the lock, the config's references

def read_folder(cfg: PipelineConfig, run_id: str) -> Folder | None:
    """A run folder's regular files with sizes, and the symbolic links in it (never followed); None when absent."""
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    store = store_for(paths.run_uri, cfg.run.s3_endpoint_url)
    if store.remote:  # an object store has no links
        prefix = paths.run_uri.rstrip("/") + "/"
        sizes = store.list_sizes(prefix)
        return Folder({u[len(prefix):]: s for u, s in sizes.items()}) if sizes else None
    root = str(store.local_path(paths.run_uri))
    if os.path.islink(root):
        return Folder(linked=True)
    if not os.path.isdir(root):
        return None
    folder, todo = Folder(), [root]
    while todo:
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                rel = os.path.relpath(entry.path, root).replace(os.sep, "/")
                if entry.is_symlink():
                    folder.links.append(rel)
                elif entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    folder.files[rel] = entry.stat(follow_symlinks=False).st_size
    folder.links.sort()
    return folder


def lock_holder(cfg: PipelineConfig) -> str | None:
    """The run id holding the nightly lock now, if any (a stale lock counts: its night may resume)."""
    from .lock import lock_uri

    uri = lock_uri(cfg)
    store = store_for(uri, cfg.run.s3_endpoint_url)
    try:
        return json.loads(store.get_bytes(uri)).get("run_id") if store.exists(uri) else None
    except (OSError, ValueError):
        return None


def config_uris(cfg: PipelineConfig) -> list[str]:
    """Paths the config itself names that may lie in a night's folder (never removed)."""
    return [u for u in [cfg.model.base_checkpoint, cfg.tokenizer.path, *cfg.evaluate.reference_heldout,
                        *cfg.evaluate.compare_checkpoints.values()] if u]


def plan_for(cfg: PipelineConfig, state: dict | None = None, now: dt.datetime | None = None,
             running: str | None = ...) -> Plan:
    """The retention plan of cfg's output root now (reads the state, the lock and the decided nights' folders)."""
    from .state import load_state

    state = load_state(cfg) if state is None else state
    run_ids = list(dict.fromkeys(n["run_id"] for n in state.get("history") or []))
    folders = {r: read_folder(cfg, r) for r in run_ids}
    return plan_retention(cfg.nightly.retention, state, folders, output_root=cfg.run.output_root,
                          now=now or dt.datetime.now(dt.timezone.utc),
                          running=lock_holder(cfg) if running is ... else running,
                          replay_on=cfg.data.replay.fraction > 0, config_uris=config_uris(cfg),
                          replay_runs=list(cfg.data.replay.runs), unsampled=unsampled(cfg, state, folders))


def unsampled(cfg: PipelineConfig, state: dict, folders: dict[str, Folder | None]) -> list[str]:
    """Promoted nights whose cleaned text is still there but the data screen's sample of it is not (nightly.screen):
    a night promoted by hand is sampled by the next night's screen, from that text."""
    if not cfg.nightly.screen.enabled:
        return []
    from .screen_sample import sample_uri

    out = []
    for run_id in promoted_nights(state):
        folder = folders.get(run_id)
        if folder and any(rel.startswith("data/cleaned/") for rel in folder.files):
            uri = sample_uri(cfg, run_id)
            if not store_for(uri, cfg.run.s3_endpoint_url).exists(uri):
                out.append(run_id)
    return out


# ------------------------------------------------------------------ applying a plan

class Refused(Exception):
    """A planned file that is not what the plan says any more (a link on its way, another type or size)."""


def _unlink_local(root: str, run_id: str, rel: str, size: int) -> None:
    """Remove <root>/<run_id>/<rel> only if every folder on the way is a real folder (opened with O_NOFOLLOW, one
    at a time, from the output root) and the file is a regular file of `size` bytes."""
    parts = [run_id, *rel.split("/")]
    if any(p in ("", ".", "..") for p in parts):
        raise Refused(f"{rel}: not a plain path")
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for part in parts[:-1]:
            try:
                fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(f"{rel}: {part} on its way is a symbolic link or not a folder: "
                                  "not followed") from None
                raise
        st = os.stat(parts[-1], dir_fd=fds[-1], follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{rel}: not a regular file any more (a link or another kind): left alone")
        if st.st_size != size:
            raise Refused(f"{rel}: {st.st_size} bytes, the plan saw {size}: changed since, left alone")
        os.unlink(parts[-1], dir_fd=fds[-1])
        for depth in range(len(fds) - 1, 1, -1):  # the folders it leaves empty, up to (not) the run folder
            try:
                os.rmdir(parts[depth - 1], dir_fd=fds[depth - 1])
            except OSError:
                break
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _tombstone(cfg: PipelineConfig, run_id: str) -> tuple[str, dict]:
    uri = join(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).run_uri, TOMBSTONE)
    store = store_for(uri, cfg.run.s3_endpoint_url)
    return uri, (json.loads(store.get_bytes(uri)) if store.exists(uri) else {"run_id": run_id, "removed": {}})


def removed_by_retention(cfg: PipelineConfig, run_id: str) -> dict:
    """{kind: {files, bytes, at, why}} that retention removed from a night's folder ({} when nothing)."""
    try:
        return _tombstone(cfg, run_id)[1].get("removed") or {}
    except (OSError, ValueError):
        return {}


def _settle(body: dict, present: set[str]) -> bool:
    """A pass cut short earlier left `removing` (file -> bytes) in the tombstone: what of it is no longer in the
    folder went then, and is added to what was removed. Returns whether the tombstone changed."""
    changed = False
    for entry in body["removed"].values():
        earlier = entry.pop("removing", None) or {}
        gone = {rel: size for rel, size in earlier.items() if rel not in present}
        entry["files"] = sorted(set(entry["files"]) | set(gone))
        entry["bytes"] = entry.get("bytes", 0) + sum(gone.values())
        changed = changed or bool(earlier)
    body["removed"] = {k: e for k, e in body["removed"].items() if e["files"]}
    return changed


def _put_tombstone(cfg: PipelineConfig, uri: str, body: dict) -> None:
    body["note"] = ("Removed by the nightly's retention (nightly.retention, docs/nightly.md 'Disk: retention and gc'); "
                    "the stage manifests still list these files, and everything else of the night is kept.")
    store_for(uri, cfg.run.s3_endpoint_url).put_bytes(uri, json.dumps(body, indent=2, sort_keys=True).encode())


def _write_tombstone(cfg: PipelineConfig, night: NightPlan, present: set[str], going: dict[str, int],
                     removed: dict[str, int], refused: list[str], at: str, status: str) -> None:
    """status "removing": the intent (per kind the files `going` with their bytes, so a pass that dies midway leaves
    the folder saying what was going; an earlier cut pass is settled first against the files `present`); "removed":
    what went (added to what earlier passes removed)."""
    uri, body = _tombstone(cfg, night.run_id)
    if status == "removing":
        _settle(body, present)
    by_kind: dict[str, dict[str, int]] = {}
    for rel, size in going.items():
        by_kind.setdefault(kind_of(rel), {})[rel] = size
    for kind, files in by_kind.items():
        entry = body["removed"].get(kind) or {"files": [], "bytes": 0}
        if status == "removing":
            entry["removing"] = dict(sorted(files.items()))
            entry.setdefault("at", at)
            entry.setdefault("why", night.why.get(kind, ""))
        else:
            done = {rel: size for rel, size in files.items() if rel in removed}
            entry.pop("removing", None)
            entry["files"] = sorted(set(entry["files"]) | set(done))
            entry["bytes"] = entry.get("bytes", 0) + sum(done.values())
            if done:
                entry.update(at=at, why=night.why.get(kind, ""))
        if entry["files"] or entry.get("removing"):
            body["removed"][kind] = entry
        else:
            body["removed"].pop(kind, None)
    if refused:
        body["refused"] = refused
    _put_tombstone(cfg, uri, body)


def _settle_cut_pass(cfg: PipelineConfig, night: NightPlan, present: set[str]) -> None:
    """A night with nothing to remove this pass whose tombstone still says `removing` (the pass was cut short after
    its last file): settle it."""
    uri, body = _tombstone(cfg, night.run_id)
    if _settle(body, present):
        _put_tombstone(cfg, uri, body)


@dataclass
class Applied:
    plan: Plan
    freed: dict[str, int] = field(default_factory=dict)    # run id -> bytes freed
    refused: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.freed.values())


def apply_plan(cfg: PipelineConfig, plan: Plan, log=print) -> Applied:
    """Remove what `plan` says (see the module docstring for the order and the checks)."""
    store = store_for(cfg.run.output_root, cfg.run.s3_endpoint_url)
    agreed: dict[str, dict[str, int]] = {}

    def intent(state: dict) -> dict:
        fresh = plan_retention(cfg.nightly.retention, state, plan.folders, output_root=plan.output_root,
                               now=dt.datetime.fromisoformat(plan.made_at), running=_running(plan),
                               replay_on=cfg.data.replay.fraction > 0, config_uris=config_uris(cfg),
                               replay_runs=list(cfg.data.replay.runs), unsampled=plan.unsampled)
        agreed.clear()
        for night in plan.nights:
            again = fresh.night(night.run_id)
            both = {rel: s for rel, s in night.files().items() if again and again.files().get(rel) == s}
            if both:
                agreed[night.run_id] = both
        gone = set(plan.expire_held) & set(fresh.expire_held)
        state["held"] = [h for h in state.get("held") or [] if h["run_id"] not in gone]
        if not state["held"]:
            state.pop("held")
        entries = state.setdefault("retention", [])
        entries.append({"at": plan.made_at, "status": "removing", "expired_held": sorted(gone),
                        "planned": {r: sum(f.values()) for r, f in agreed.items()}})
        del entries[:-STATE_ENTRIES_KEPT]
        return state

    update_state(cfg, intent)
    out = Applied(plan)
    root = None if store.remote else os.path.realpath(str(store.local_path(cfg.run.output_root)))
    for night in plan.nights:
        files = agreed.get(night.run_id)
        present = set(plan.folders[night.run_id].files)
        if not files:
            if TOMBSTONE in present:  # a night thinned before: its tombstone may hold a cut pass's intent
                _settle_cut_pass(cfg, night, present)
            continue
        _write_tombstone(cfg, night, present, files, {}, [], plan.made_at, "removing")
        removed: dict[str, int] = {}
        if store.remote:
            prefix = RunPaths(cfg.run.output_root, night.run_id, cfg.run.s3_endpoint_url).run_uri.rstrip("/") + "/"
            now_there = store.list_sizes(prefix)
            ok = []
            for rel, size in files.items():
                uri = prefix + rel
                if now_there.get(uri) != size:
                    out.refused.append(f"{night.run_id}/{rel}: {now_there.get(uri)} bytes now, the plan saw {size}: "
                                       "left alone")
                    continue
                ok.append(uri)
                removed[rel] = size
            store.delete_objects(ok)
        else:
            for rel, size in files.items():
                try:
                    _unlink_local(root, night.run_id, rel, size)
                    removed[rel] = size
                except Refused as why:
                    out.refused.append(f"{night.run_id}/{why}")
                except FileNotFoundError:
                    out.refused.append(f"{night.run_id}/{rel}: gone already")
        _write_tombstone(cfg, night, present, files, removed,
                         [r for r in out.refused if r.startswith(night.run_id + "/")], plan.made_at, "removed")
        out.freed[night.run_id] = sum(removed.values())
        log(f"retention: {night.run_id}: freed {size_text(out.freed[night.run_id])}")

    def done(state: dict) -> dict:
        for entry in reversed(state.get("retention") or []):
            if entry.get("at") == plan.made_at and entry.get("status") == "removing":
                entry.update(status="done", freed=out.total, nights=out.freed, refused=len(out.refused))
                break
        return state

    update_state(cfg, done)
    return out


def _running(plan: Plan) -> str | None:
    return next((r for r, why in plan.untouched.items() if why.startswith("holds the nightly lock")), None)


def gc(cfg: PipelineConfig, dry_run: bool = False, log=print, running: str | None = ...) -> Applied:
    """Plan the retention of cfg's output root and, unless dry_run, apply it. `running`: the night that holds the
    lock (default: whoever holds it now; the nightly passes its own run id)."""
    plan = plan_for(cfg, running=running)
    if dry_run or not (plan.nights or plan.expire_held):  # no decided night yet: no state to write to
        return Applied(plan)
    return apply_plan(cfg, plan, log)


def plan_lines(applied: Applied, dry_run: bool, verbose: bool = False) -> list[str]:
    """What `llm-pipeline gc` prints: per night what it frees (by kind, with why), the nights it leaves as they are,
    then the total. verbose: also why each night keeps what it keeps."""
    plan, verb = applied.plan, "would free" if dry_run else "freed"
    lines = [f"gc {plan.output_root}: {len(plan.nights)} decided night(s)"]
    quiet = []
    for night in plan.nights:
        freed = night.bytes() if dry_run else applied.freed.get(night.run_id, 0)
        kept = [f"{kind}: {night.why[kind]}" for kind in KINDS if kind in night.why and not night.remove.get(kind)]
        kept += [f"{kind} pinned: {why}" for kind, why in night.pinned.items()]
        if not night.remove and not night.links and not verbose:
            quiet.append(night.run_id)
            continue
        parts = [f"{kind} {size_text(night.bytes(kind))} ({night.why.get(kind, '')})" for kind in KINDS
                 if night.remove.get(kind)]
        lines.append(f"  {night.run_id}: {verb} {size_text(freed)}" + (": " + "; ".join(parts) if parts else ""))
        if kept and verbose:
            lines.append("      kept: " + "; ".join(kept))
        if night.links:
            lines.append(f"      symbolic link(s) not followed, left as they are: {', '.join(night.links)}")
    if quiet:
        lines.append(f"  nothing to remove: {', '.join(quiet)}")
    for run_id, why in plan.untouched.items():
        lines.append(f"  {run_id}: untouched, {why}")
    if plan.expire_held:
        lines.append(f"  held past nightly.retention.held_days (they leave `held`): {', '.join(plan.expire_held)}")
    total = plan.total if dry_run else applied.total
    files = sum(len(n.files()) for n in plan.nights)
    lines.append(f"total: {verb} {size_text(total)} ({total:,} bytes" + (f" in {files} file(s)" if dry_run else "")
                 + ")" + (" -- dry run: nothing was removed" if dry_run else ""))
    lines += [f"refused: {r}" for r in applied.refused]
    return lines


def after_night(cfg: PipelineConfig, run_id: str, logger) -> Applied | None:
    """The nightly's pass after a night ends (nightly.retention.gc_after_night), inside its lock: tonight's folder is
    untouched (it is the running night). A failure is a warning: the night is decided and committed already."""
    if not cfg.nightly.retention.gc_after_night:
        return None
    try:
        applied = gc(cfg, log=logger.info, running=run_id)
    except Exception as err:  # the store, a permission: tomorrow's pass (or `llm-pipeline gc`) tries again
        logger.warning(f"{run_id}: the retention pass failed ({type(err).__name__}: {err}); nothing of tonight is "
                       "affected. Fix: see the error, then run `llm-pipeline gc CONFIG`")
        return None
    if applied.total or applied.refused:
        logger.info(f"{run_id}: retention freed {size_text(applied.total)} of older nights"
                    + (f"; refused {len(applied.refused)}: {applied.refused[0]}" if applied.refused else ""))
    return applied


def retention_note(cfg: PipelineConfig, run_id: str, stage: str, why: str) -> str | None:
    """For a stage that reads as not done because an output is missing: the tombstone's word when retention removed
    it (the stage finished; its manifest still lists the file), else None."""
    missing = "output missing: "
    if not why.startswith(missing):
        return None
    rel = f"{stage}/{why[len(missing):]}"
    for kind, entry in removed_by_retention(cfg, run_id).items():
        if rel in entry.get("files", []):
            return (f"finished; its {kind} were removed by nightly.retention on {entry.get('at', '?')[:10]} "
                    f"({entry.get('why', '')}; {run_id}/{TOMBSTONE})")
    return None


def removed_lines(cfg: PipelineConfig, run_id: str) -> list[str]:
    """What `status` says of a night retention thinned: per kind, the bytes, when and why."""
    return [f"retention: {kind} removed on {e.get('at', '?')[:10]}: {size_text(e.get('bytes', 0))} in "
            f"{len(e.get('files', []))} file(s) ({e.get('why', '')}); {run_id}/{TOMBSTONE} lists them"
            + (f"; a pass removing {len(e['removing'])} more was interrupted (the next pass finishes it)"
               if e.get("removing") else "")
            for kind, e in removed_by_retention(cfg, run_id).items()]
