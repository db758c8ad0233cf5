"""A month of nights through `llm-pipeline nightly`, as a team leaves it alone (prints a table; not a test).

    python bench/nightly_month.py [--work /tmp/nightly-month] [--steps 6] [--tmpfs-mb 700] [--nights N]

Each date copies that night's files into an incoming folder first, then runs the shipped tiny config
(`configs/pipelines/tiny-cpu.yaml`, `training.steps=--steps`) with the CLI a user runs, in a fresh output root.
The nights: good domain text most nights (the bundled corpus, then documents generated from its templates with a
seed a night, none a near duplicate of another), garbage of four kinds (random CJK characters, corpus documents
with their characters shuffled, word salad of 2-3 character fragments of the corpus, a scraper's boilerplate),
a duplicate-only night, a broken-only night, an empty file, a killed trainer (the trainer process is killed
mid-night, then the date is run again, as a person or tomorrow's retry would), a nearly full disk (with
--tmpfs-mb, run as root: the output root is a tmpfs and a ballast file leaves it almost full for one night), one
large file (30,000 documents), a night mixing a good file and a garbage file, a second run on a date already
decided, an `ask` night nobody answers, and a night with nothing new.

Printed: per night the date, the data, the final state, why (its message, cut), `latest`, the disk of the output
root and the wall time; then the month's figures: garbage documents that reached the promoted model (must be 0),
the share of the good nights' accepted documents that reached it (directly or carried; >= 90%), the disk per
night after the retention horizon (must stop growing) and the wall time per trained night against the night's
index (must not grow). The raw results go to <work>/month.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from make_tiny_corpus import _doc, _shingles  # noqa: E402  (the bundled corpus's own templates)

CONFIG = "configs/pipelines/tiny-cpu.yaml"
GOOD, GARBAGE = "good", "garbage"


def _lines(records: list[dict]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


class Corpus:
    """Good documents that are no near duplicate of one another (Jaccard of 5-gram shingles < 0.5)."""

    def __init__(self):
        self.bundled = [json.loads(x) for x in (ROOT / "configs/data/tiny_corpus.jsonl").read_bytes().splitlines()
                        if x.strip().startswith(b"{") and _is_doc(x)]
        self.postings: dict = {}
        self.sizes: list[int] = []
        for rec in self.bundled:
            self._admit(rec["text"])

    def _admit(self, text: str, check: bool = False) -> bool:
        sh = _shingles(text)
        if check:
            shared: dict[int, int] = {}
            for s in sh:
                for i in self.postings.get(s, ()):
                    shared[i] = shared.get(i, 0) + 1
            if any(n / (len(sh) + self.sizes[i] - n) >= 0.5 for i, n in shared.items()):
                return False
        for s in sh:
            self.postings.setdefault(s, []).append(len(self.sizes))
        self.sizes.append(len(sh))
        return True

    def fresh(self, n: int, seed: int, prefix: str, check: bool = True) -> list[dict]:
        rng, out = random.Random(seed), []
        while len(out) < n:
            text = _doc(rng, zh=rng.random() < 0.65)
            if not check or self._admit(text, check):  # unchecked ones (the large file) are not indexed: it would
                # make every later check walk postings of thousands; dedup decides about them
                out.append({"id": f"{prefix}-{len(out):05d}", "text": text, "source": "generated"})
        return out


def _is_doc(raw: bytes) -> bool:
    try:
        rec = json.loads(raw)
        return isinstance(rec, dict) and isinstance(rec.get("text"), str) and len(rec["text"]) > 40
    except ValueError:
        return False


def random_chars(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"rand-{seed}-{i}", "text": "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(150))}
            for i in range(n)]


def shuffled(docs: list[dict], seed: int) -> list[dict]:
    rng, out = random.Random(seed), []
    for i, d in enumerate(docs):
        chars = list(d["text"])
        rng.shuffle(chars)
        out.append({"id": f"shuf-{seed}-{i}", "text": "".join(chars)})
    return out


def word_salad(docs: list[dict], n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    zh = [d["text"] for d in docs if not d["text"].isascii()]
    frags = [t[i:i + rng.randint(2, 3)] for t in zh for i in range(0, len(t) - 3, 3)]
    return [{"id": f"salad-{seed}-{i}", "text": "".join(rng.choice(frags) for _ in range(60))} for i in range(n)]


def boilerplate(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    menus = ["首页", "新闻中心", "产品展示", "关于我们", "联系我们", "招聘信息", "网站地图", "客户服务", "下载中心"]
    tails = ["版权所有", "备案号", "技术支持", "免责声明", "隐私政策", "友情链接", "返回顶部", "设为首页", "加入收藏"]
    out = []
    for i in range(n):
        parts = rng.sample(menus, 6) + [f"{rng.choice(tails)}：{rng.randint(2000, 2026)}-{rng.randint(1000, 99999)}"
                                        for _ in range(4)] + [f"本站共有{rng.randint(10, 9999)}条信息，"
                                                              f"今日更新{rng.randint(1, 99)}条。"]
        rng.shuffle(parts)
        out.append({"id": f"boiler-{seed}-{i}", "text": " | ".join(parts) + "。点击进入。" * rng.randint(1, 3)})
    return out


def broken(n: int) -> bytes:
    return b"".join(b'{"text": "an unterminated record number %d\n' % i for i in range(n))


def plan_month(corpus: Corpus, nights: int) -> list[dict]:
    """The month: [{date, kind, label, files: {name: bytes}, extra: [...], ...}]."""
    first = dt.date(2026, 11, 1)
    good_docs = corpus.bundled
    month: list[dict] = []

    def night(kind: str, label: str, files, **more) -> None:
        """`files`: {name: bytes}, or a function making them (only called for a night within --nights)."""
        if len(month) < nights:
            month.append({"date": (first + dt.timedelta(days=len(month))).isoformat(), "kind": kind, "label": label,
                          "files": files() if callable(files) else files, **more})

    def good(n: int = 120, **more) -> None:
        i = len(month)
        night(GOOD, f"{n} new good documents",
              lambda: {f"d{i:02d}-good.jsonl": _lines(corpus.fresh(n, 1000 + i, f"g{i}"))}, **more)

    night(GOOD, f"{len(good_docs)} good documents (the bundled corpus)", {"d00-good.jsonl": _lines(good_docs)})
    good()
    good()
    night(GARBAGE, "150 documents of random CJK characters", {"d03-random.jsonl": _lines(random_chars(150, 3))})
    good()
    night(GARBAGE, "150 corpus documents, characters shuffled", {"d05-shuffled.jsonl": _lines(shuffled(good_docs[:150], 5))})
    good()
    night("duplicate", "200 documents all trained before", {"d07-dup.jsonl": _lines(good_docs[:200])})
    good()
    night(GARBAGE, "150 documents of word salad (2-3 character fragments)",
          {"d09-salad.jsonl": _lines(word_salad(good_docs, 150, 9))})
    good()
    night("broken", "a file of 50 broken JSON lines", {"d11-broken.jsonl": broken(50)})
    good(kill_trainer=True)
    night("empty", "an empty file", {"d13-empty.jsonl": b""})
    good()
    night(GARBAGE, "150 documents of a scraper's boilerplate", {"d15-boiler.jsonl": _lines(boilerplate(150, 15))})
    good(disk_full=True)
    good()
    i = len(month)
    night(GOOD, "one large file: 30,000 generated documents",
          lambda: {f"d{i:02d}-large.jsonl": _lines(corpus.fresh(30000, 1000 + i, f"g{i}", check=False))})
    good()
    good(rerun_same_date=True)
    i = len(month)
    night("mixed", "120 new good documents + 150 shuffled in another file",
          lambda: {f"d{i:02d}-good.jsonl": _lines(corpus.fresh(120, 1000 + i, f"g{i}")),
                   f"d{i:02d}-shuffled.jsonl": _lines(shuffled(good_docs[150:300], i))})
    good(ask=True)
    night("nothing", "no new file", {})
    while len(month) < nights:
        good()
    return month[:nights]


def du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def _kill_trainer_when_training(proc: subprocess.Popen, runs: Path, date: str, deadline_s: float = 900) -> str:
    """SIGKILL the night's trainer process (pipeline_lib.train.entry) once it has written two steps."""
    import psutil

    started = time.time()
    while proc.poll() is None and time.time() - started < deadline_s:
        steps = sum(len(p.read_bytes().splitlines()) for p in runs.glob(f"nightly-{date}*/pretrain/metrics.jsonl"))
        if steps >= 2:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if "pipeline_lib.train.entry" in " ".join(child.cmdline()):
                        child.send_signal(signal.SIGKILL)
                        return f"killed the trainer (pid {child.pid}) after {steps} steps"
                except psutil.Error:
                    continue
        time.sleep(0.2)
    return "no trainer seen to kill"


def run_night(work: Path, date: str, overrides: list[str], kill: bool = False) -> dict:
    cmd = [str(ROOT / ".venv/bin/llm-pipeline"), "nightly", CONFIG, "--run-date", date, *overrides]
    t0 = time.time()
    log = (work / "logs" / f"{date}-{int(t0)}.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    note = _kill_trainer_when_training(proc, work / "runs", date) if kill else ""
    rc = proc.wait()
    log.close()
    out = Path(log.name).read_text(errors="replace")
    end = [ln for ln in out.splitlines() if ln.startswith("nightly ")]
    return {"rc": rc, "wall": time.time() - t0, "line": end[-1] if end else out.strip().splitlines()[-1:],
            "log": log.name, "note": note}


def _mount_tmpfs(path: Path, mb: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(path)]).returncode == 0


def state_of(runs: Path) -> dict:
    p = runs / "_nightly" / "state.json"
    return json.loads(p.read_text()) if p.exists() else {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/nightly-month")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--nights", type=int, default=32)
    ap.add_argument("--tmpfs-mb", type=int, default=0, help="output root on a tmpfs of this size (root only)")
    args = ap.parse_args()
    work = Path(args.work)
    if work.exists():
        subprocess.run(["umount", str(work / "runs")], capture_output=True)
        shutil.rmtree(work)
    (work / "incoming").mkdir(parents=True)
    (work / "logs").mkdir()
    runs = work / "runs"
    tmpfs = bool(args.tmpfs_mb) and _mount_tmpfs(runs, args.tmpfs_mb)
    corpus = Corpus()
    month = plan_month(corpus, args.nights)
    base = [f"data.inputs=[{work}/incoming/*.jsonl]", f"run.output_root={runs}", f"training.steps={args.steps}",
            "training.save_steps=3", "training.warmup_steps=1"]
    results = []
    for night in month:
        for name, body in night["files"].items():
            (work / "incoming" / name).write_bytes(body)
        extra = ["nightly.gate.on_regression=ask", "nightly.gate.ask_timeout_hours=0.01"] if night.get("ask") else []
        ballast = runs / "ballast.bin"
        if night.get("disk_full") and tmpfs:
            free = shutil.disk_usage(runs).free
            subprocess.run(["fallocate", "-l", str(max(free - 12 * 2**20, 0)), str(ballast)], check=True)
        r = run_night(work, night["date"], base + extra, kill=night.get("kill_trainer", False))
        tries = [r]
        if night.get("kill_trainer") or night.get("disk_full"):
            if ballast.exists():
                ballast.unlink()
            tries.append(run_night(work, night["date"], base + extra))  # the person reruns the date
        if night.get("rerun_same_date"):
            name = f"d{len(results):02d}-late.jsonl"
            (work / "incoming" / name).write_bytes(_lines(corpus.fresh(60, 5000 + len(results), f"late{len(results)}")))
            night["files"][name] = b""
            tries.append(run_night(work, night["date"], base))  # a second run of a date already decided
        st = state_of(runs)
        row = {"date": night["date"], "kind": night["kind"], "data": night["label"], "files": sorted(night["files"]),
               "tries": [{k: t[k] for k in ("rc", "wall", "line", "note")} for t in tries],
               "latest": (st.get("latest") or {}).get("run_id"), "disk": du(runs),
               "wall": sum(t["wall"] for t in tries)}
        results.append(row)
        print(f"{row['date']} {row['kind']:9} {row['wall']:6.0f}s disk {row['disk'] / 2**20:7.1f} MiB "
              f"latest {row['latest']} | " + " || ".join(str(t["line"])[:160] for t in tries), flush=True)
    st = state_of(runs)
    report = {"results": results, "state": st, "tmpfs": tmpfs}
    report["figures"] = figures(results, st, runs)
    # what the output root holds at the end, by top-level folder (the tmpfs is unmounted below)
    report["figures"]["disk_mib_by_folder"] = {p.name: round(du(p) / 2**20, 2) for p in sorted(runs.iterdir())
                                               if p.is_dir()}
    (work / "month.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(table(results))
    print(json.dumps(report["figures"], indent=1))
    if tmpfs:
        subprocess.run(["umount", str(runs)])
    return 0


def _file_status(st: dict) -> dict[str, dict]:
    return {uri.rsplit("/", 1)[-1]: entry for uri, entry in (st.get("ledger") or {}).items()}


def _kept_per_file(runs: Path) -> dict[str, int]:
    """Documents the data stage accepted per input file name, over all nights (the last night that read it)."""
    kept: dict[str, int] = {}
    for stats in sorted(runs.glob("nightly-*/data/stats.json")):
        for uri, entry in json.loads(stats.read_text()).get("files", {}).items():
            kept[uri.rsplit("/", 1)[-1]] = entry.get("kept", 0)
    return kept


def figures(results: list[dict], st: dict, runs: Path) -> dict:
    ledger = _file_status(st)
    kept = _kept_per_file(runs)
    promoted = {h["run_id"] for h in st.get("history", []) if str(h.get("decision", "")).startswith("promoted")}
    garbage_in, good_total, good_in = 0, 0, 0
    for r in results:
        for name in r["files"]:
            entry = ledger.get(name, {})
            reached = entry.get("status") == "trained" and entry.get("into") in promoted
            docs = entry.get("documents", {}).get("kept", kept.get(name, 0)) if isinstance(entry.get("documents"), dict) \
                else kept.get(name, 0)
            if r["kind"] == GARBAGE or "shuffled" in name:
                garbage_in += docs if reached else 0
            elif r["kind"] == GOOD or name.endswith("-good.jsonl") or name.endswith("-late.jsonl"):
                good_total += docs
                good_in += docs if reached else 0
    trained = [r for r in results if r["kind"] == GOOD and r["tries"] and "Promoted" in str(r["tries"][-1]["line"])]
    walls = [(i, r["wall"]) for i, r in enumerate(results) if r in trained and "large" not in r["data"]]
    slope = None
    if len(walls) > 2:
        import numpy as np

        x, y = np.array(walls).T
        slope = float(np.polyfit(x, y, 1)[0])
    disks = [r["disk"] for r in results]
    return {"garbage_documents_in_promoted": garbage_in, "good_documents_accepted": good_total,
            "good_documents_in_promoted": good_in, "good_share": good_in / good_total if good_total else None,
            "promoted_nights": len(promoted), "wall_s_per_night_slope": slope,
            "disk_mib_last_10": [round(d / 2**20, 1) for d in disks[-10:]],
            "disk_mib_max": round(max(disks) / 2**20, 1) if disks else 0}


def table(results: list[dict]) -> str:
    lines = ["| date | data | decision | why | latest | disk | wall |", "|---|---|---|---|---|---|---|"]
    for r in results:
        why = " / ".join(re.sub(r"\s+", " ", str(t["line"]))[:140] + (f" ({t['note']})" if t["note"] else "")
                         for t in r["tries"])
        decision = " / ".join((re.match(r"nightly (\w+)", str(t["line"])) or [None, "?"])[1] for t in r["tries"])
        lines.append(f"| {r['date']} | {r['data']} | {decision} | {why.replace('|', '/')} | {r['latest']} | "
                     f"{r['disk'] / 2**20:.1f} MiB | {r['wall']:.0f} s |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
