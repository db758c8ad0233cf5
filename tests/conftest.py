"""Shared fixtures: quiet MindSpore/mindformers logs, a real S3 endpoint (moto server over HTTP)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Before anything imports mindspore/mindformers: keep logs and compile dumps out of the repo.
_LOGS = Path(os.environ.setdefault("LLM_PIPELINE_TEST_TMP", "/tmp/llm-pipeline-tests"))
os.environ.setdefault("LOG_MF_PATH", str(_LOGS / "mf_log"))
os.environ.setdefault("MS_OM_PATH", str(_LOGS / "ms_om"))
os.environ.setdefault("GLOG_v", "3")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The moto endpoint's credentials from the start: the data stage's pools fork from multiprocessing's forkserver,
# which keeps the environment of the moment it started (the first pool of this process), whatever test came first.
for _key, _value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                     ("AWS_DEFAULT_REGION", "us-east-1")):
    os.environ.setdefault(_key, _value)

# The session's data stage of the tiny corpus, defined here once: a session fixture imported into several test
# modules is one fixture per module to pytest, built again in each (it was, eight times a session).
sys.path.insert(0, str(ROOT / "tests" / "train"))
from pretrain_fixtures import pretrain_data  # noqa: E402,F401


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """A real S3 API over HTTP on 127.0.0.1 (moto in server mode), with credentials in the env."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    try:
        wait_http(url + "/moto-api/", 30, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A fresh bucket per test: returns (s3://bucket, endpoint_url)."""
    import uuid

    import boto3

    name = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return f"s3://{name}", s3_endpoint


@pytest.fixture(scope="session")
def prefect_database(tmp_path_factory):
    """The shared server's database: a real PostgreSQL (tests/postgres.py), what a team's server runs on
    (SQLite answered 503 to a busy UI form). Where PostgreSQL cannot run, SQLite with a warning, except in CI,
    where that fails the session's server tests (suite_rules.machine_skip)."""
    from postgres import PostgresCluster, available
    from suite_rules import in_ci

    why = available()
    if why:
        if in_ci():
            pytest.fail(f"{why}: the server-backed tests run on PostgreSQL in CI", pytrace=False)
        import warnings

        warnings.warn(f"{why}: the Prefect server of this session uses SQLite")
        yield f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('prefect_db')}/prefect.db"
        return
    cluster = PostgresCluster.start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory, prefect_database):
    """A real `prefect server start` on PostgreSQL (prefect_database), analytics off, UI on, on a free loopback
    port.

    Yields the API URL; this process and every subprocess the tests start talk to it.
    """
    port = free_port()
    home = tmp_path_factory.mktemp("prefect_home")
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_API_PORT=str(port),
               PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_ENABLED="true",  # the browser tests (tests/ui) open the UI; starts no slower
               PREFECT_API_DATABASE_CONNECTION_URL=prefect_database)
    env.pop("PREFECT_API_URL", None)
    log = home / "server.log"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        wait_http(api + "/health", 90, proc)
    except RuntimeError:
        proc.kill()
        raise RuntimeError(log.read_text()[-3000:])
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    os.environ["PREFECT_API_URL"] = api
    os.environ["PREFECT_HOME"] = str(home)
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, PREFECT_HOME, temporary_settings

    # Flows run in this process (not a worker's: os.environ keeps Prefect's default for those) send no flow-run
    # heartbeats: the end of every flow run waits for its heartbeat thread's 1-s sleep (measured: 8.7 s of one
    # 17 s test of two nights, ~8 flow runs a night), and what heartbeats are for, a server noticing that a
    # flow's process died, is what the worker-dispatched tests (tests/deployments, tests/ui, two-node) keep.
    with temporary_settings({PREFECT_API_URL: api, PREFECT_HOME: str(home), PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield api
        from flows.cli import drain_prefect_queues

        drain_prefect_queues(timeout=15)  # else ~1 min of "Error logging to API" retries ends every session
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    import signal

    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def sigkill_parent(tmp_path):
    """Run a Python script that starts children and prints `READY <pid> <pid> ...` (their pids, maybe more
    fields), SIGKILL it, and return (pids still alive `within` s later, the READY fields).

    Usage: `alive, fields = sigkill_parent(script_text, within=10)`. The script runs with the project on
    PYTHONPATH, a private PREFECT_HOME and no PREFECT_API_URL. Whatever survives is killed at teardown.
    """
    import psutil

    survivors: list = []

    def run(script: str, within: float = 10.0, ready_timeout: float = 120.0, env: dict | None = None):
        path = tmp_path / f"parent_{len(survivors)}.py"
        path.write_text(script, encoding="utf-8")
        child_env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        child_env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                         PREFECT_HOME=str(tmp_path / "prefect_home"), **(env or {}))
        proc = subprocess.Popen([sys.executable, str(path)], cwd=ROOT, env=child_env, stdout=subprocess.PIPE,
                                text=True)
        deadline, fields = time.time() + ready_timeout, None
        try:
            while time.time() < deadline:  # the script's own output before READY is ignored
                line = proc.stdout.readline()
                if not line:
                    break
                if line.startswith("READY "):
                    fields = line.split()[1:]
                    break
            assert fields, f"{path.name} exited with {proc.poll()} before printing READY"
            children = [psutil.Process(int(f)) for f in fields if f.isdigit() and psutil.pid_exists(int(f))]
            survivors.extend(children)
        finally:
            proc.kill()
            proc.wait()
        gone, alive = psutil.wait_procs(children, timeout=within)
        return sorted(p.pid for p in alive), fields

    yield run
    for proc in survivors:
        try:
            proc.kill()
        except psutil.Error:
            pass


def llama2_layout_tokenizer(out_dir: Path, vocab_size: int = 1000) -> Path:
    """A sentencepiece model with Llama-2's exact id layout and options, trained on the bundled corpus and
    instruction data: unk 0 `<unk>`, bos 1 `<s>`, eos 2 `</s>`, no pad piece, byte fallback, sentencepiece's
    default normalization and dummy prefix, no chat marker pieces."""
    import io
    import json

    import sentencepiece as spm

    texts = []
    for name in ("tiny_corpus.jsonl", "tiny_sft.jsonl"):
        for line in (ROOT / "configs" / "data" / name).read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                texts += [v for v in obj.values() if isinstance(v, str) and len(v) > 3]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, model_type="bpe",
                                   vocab_size=vocab_size, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   byte_fallback=True, minloglevel=2, num_threads=1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.model").write_bytes(model.getvalue())
    return out_dir / "tokenizer.model"


@pytest.fixture(scope="session")
def llama2_tokenizer(tmp_path_factory) -> Path:
    """tokenizer.model with Llama-2's id layout (see llama2_layout_tokenizer), trained once per session."""
    return llama2_layout_tokenizer(tmp_path_factory.mktemp("llama2_tok"))


# ---------------------------------------------------------------- markers that select truthfully (suite_rules)

_SETUP_S = pytest.StashKey[float]()
_SHARED_S = pytest.StashKey[float]()  # setup of fixtures shared beyond the test (module/session): not its own cost


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    started = time.perf_counter()
    yield
    if fixturedef.scope != "function":
        node = request.node
        item = node if isinstance(node, pytest.Item) else getattr(request, "_pyfuncitem", None)
        if item is not None:
            item.stash[_SHARED_S] = item.stash.get(_SHARED_S, 0.0) + time.perf_counter() - started


# The files of about 40 s or more, longest first (seconds per file in the clean-clone CI run of 2026-12-04 14:52 on
# 2 cores, less what the commits after it cut): only the order they start in, so a stale list costs time, never a
# result.
LONGEST_FIRST = (
    "tests/acceptance/test_nightly.py",  # 243, less 3 CLI runs (~37 s at lower load)
    "tests/ui/test_operator_walk.py",  # 201
    "tests/acceptance/test_demo.py",  # 184
    "tests/reliability/test_kill_points.py",  # 171 (+ the weights hand-off's checks, ~3 s)
    "tests/train/test_pretrain_stage.py",  # 154
    "tests/flows/test_two_node_dispatch.py",  # 113
    "tests/deployments/test_deployments.py",  # 115, less one worker run (~20-30 s)
    "tests/reliability/test_storage_faults.py",  # 79
    "tests/ui/test_run_views.py",  # 77
    "tests/flows/test_nightly_gate.py",  # 72, less two nights 1 (~7 s)
    "tests/acceptance/test_real_base.py",  # 63
    "tests/train/test_sft_stage.py",  # 60
    "tests/acceptance/test_shipped_configs_s3.py",  # 56
    "tests/train/test_checkpoint_format.py",  # 45
    "tests/flows/test_nightly_ask_lease.py",  # 44, less a 12-s pause
)


def pytest_collection_modifyitems(config, items):
    """Markers a whole folder earns: tests/ui opens a browser, tests/acceptance runs the product as a user does."""
    by_folder = {"ui": "browser", "acceptance": "e2e"}
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(ROOT / "tests").parts
        if parts and parts[0] in by_folder:
            item.add_marker(by_folder[parts[0]])
    # Long files first (a file stays whole, in its order): the xdist workers then end together instead of
    # one running the longest file alone at the end (make test passes --no-loadscope-reorder: xdist's own order
    # is "most tests first", which put the one-test files of minutes, test_demo and test_nightly, last).
    # LONGEST_FIRST as measured, then by marker. Deterministic, as every worker must collect alike.
    weight = {"train": 3, "e2e": 2, "browser": 2, "slow": 1}
    files: dict[str, int] = {}
    for item in items:
        marks = [weight[m.name] for m in item.iter_markers() if m.name in weight]
        files[item.nodeid.split("::")[0]] = max(files.get(item.nodeid.split("::")[0], 0), *marks, 0)

    def rank(f: str) -> tuple[int, int]:
        return (LONGEST_FIRST.index(f), 0) if f in LONGEST_FIRST else (len(LONGEST_FIRST), -files[f])

    order = {f: i for i, f in enumerate(sorted(files, key=rank))}
    items.sort(key=lambda item: order[item.nodeid.split("::")[0]])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Fail a test that took longer than SLOW_SECONDS (its own setup included; a module or session fixture it
    happens to build first is shared, not counted) without a selecting marker: `-m "not (slow or train or e2e or browser)"` must stay fast."""
    from suite_rules import SELECTING_MARKERS, SLOW_SECONDS, slow_limit

    outcome = yield
    report = outcome.get_result()
    if report.when == "setup":
        item.stash[_SETUP_S] = max(0.0, call.duration - item.stash.get(_SHARED_S, 0.0))
    elif report.when == "call" and report.passed:
        took = item.stash.get(_SETUP_S, 0.0) + call.duration
        if took > slow_limit() and not any(item.get_closest_marker(m) for m in SELECTING_MARKERS):
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} took {took:.1f} s (own setup {item.stash.get(_SETUP_S, 0.0):.1f} s) and "
                               f"carries none of the markers {', '.join(SELECTING_MARKERS)}: mark it (`train` when it "
                               "trains, `e2e` when it runs the CLI or a flow end to end, else `slow`) or make it "
                               f"faster than {SLOW_SECONDS:.0f} s")


_CPU_AT_START = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    """CPU of this process and of every subprocess it has reaped (their own reaped children included)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    # on the teardown report (it travels to the xdist controller with its user_properties): the CPU of the whole
    # test, its subprocesses (trainers, CLIs) included; a session server is reaped at the end, counted nowhere
    now = _cpu_seconds()
    item.user_properties.append(("cpu_s", now - item.stash.get(_CPU_AT_START, now)))


def pytest_terminal_summary(terminalreporter):
    """The slowest files (setup + call + teardown of their tests, seconds of one worker each) and their CPU (the
    tests' processes and reaped subprocesses): what LONGEST_FIRST orders by, and the table to compare between runs.
    On 2 cores the suite cannot end sooner than its CPU over 2."""
    per_file: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if isinstance(rep, pytest.TestReport):
                f = rep.nodeid.split("::")[0]
                per_file[f] = per_file.get(f, 0.0) + rep.duration
                cpu[f] = cpu.get(f, 0.0) + sum(v for k, v in rep.user_properties if k == "cpu_s")
    if not per_file:
        return
    terminalreporter.write_sep("=", "slowest 15 files (seconds, all phases; CPU of the tests and their subprocesses)")
    for f, s in sorted(per_file.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{s:8.1f}s  {cpu[f]:7.1f}s cpu  {f}")
    terminalreporter.write_line(f"{sum(per_file.values()):8.1f}s  {sum(cpu.values()):7.1f}s cpu  in all "
                                f"{len(per_file)} files (summed over workers)")
    terminalreporter.write_sep("=", "most CPU: 15 files")
    for f, c in sorted(cpu.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{c:8.1f}s cpu  {per_file[f]:7.1f}s  {f}")
