"""Secrets (issue 16): with S3 credentials and a webhook URL holding a token set, nothing we write holds them.

`llm-pipeline run` (in-process, on a real Prefect server) runs the data stage into an S3 run store (moto),
then a run that fails (all records malformed) so the failure webhook is posted to a local HTTP server.
Then every byte is scanned for the secrets, as written and URL-encoded, JSON-escaped, hex and base64:
every object under the bucket, the data stage's local work folders, the stage logs, the CLI's output,
the webhook payloads, the Prefect server's database files and result storage, and the Prefect API's
records (flow runs with their parameters, task runs, logs, artifacts, variables).
"""
from __future__ import annotations

import base64
import contextlib
import datetime
import io
import json
import os
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

RELIABILITY_ROW = "secrets"
pytestmark = pytest.mark.slow  # a Prefect server, S3, two data-stage runs: ~60 s
ROOT = Path(__file__).resolve().parents[2]
ACCESS_KEY = "AKIAQXLEAKPROBE7Z2W"
SECRET_KEY = "zQ9+lEaK/pr0be=S3cr3t+Fu55/8Xv"
HOOK_TOKEN = "hooktok-7Yq2LeakProbe9"
QUERY_TOKEN = "qt+Leak/Probe=55"
SECRETS = {"aws access key": ACCESS_KEY, "aws secret key": SECRET_KEY, "webhook path token": HOOK_TOKEN,
           "webhook query token": QUERY_TOKEN}


def forms(secret: str) -> set[bytes]:
    """The secret as bytes in every encoding a writer might use (base64 at each of its 3 alignments)."""
    raw = secret.encode()
    out = {raw, urllib.parse.quote(secret, safe="").encode(), urllib.parse.quote(secret).encode(), urllib.parse.quote_plus(secret).encode(),
           json.dumps(secret)[1:-1].encode(), secret.replace("/", "\\/").encode(), raw.hex().encode()}
    for pad in range(3):  # the secret's own base64 characters, wherever it starts in the encoded text
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            full = enc(b"\0" * pad + raw)
            start = (pad * 4 + 2) // 3 + 1
            core = full[start:start + max(len(raw) * 4 // 3 - 4, 8)]
            out.add(core)
    return out


PATTERNS = {name: forms(value) for name, value in SECRETS.items()}


# A presigned S3 link (the run overview's links to outputs) carries the access key *id* by design (AWS signs
# with the secret key, which never appears); the id is allowed there and nowhere else.
PRESIGNED_KEY_ID = re.compile(rb"(AWSAccessKeyId=|X-Amz-Credential=)" + re.escape(ACCESS_KEY.encode()))


class Scan:
    def __init__(self):
        self.bytes = 0
        self.presigned_links = 0
        self.found: list[str] = []

    def scan(self, where: str, data: bytes) -> None:
        self.bytes += len(data)
        data, n = PRESIGNED_KEY_ID.subn(rb"\1<key id>", data)
        self.presigned_links += n
        for name, patterns in PATTERNS.items():
            if any(p in data for p in patterns):
                self.found.append(f"{name} in {where}")

    def scan_tree(self, root: Path, label: str) -> None:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            with contextlib.suppress(OSError):
                self.scan(f"{label}/{path.relative_to(root)}", path.read_bytes())


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _cli(argv: list[str]) -> tuple[int, str]:
    from flows.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


def _paged(read, **kw) -> list:
    out, offset = [], 0
    while True:
        page = read(limit=200, offset=offset, **kw)
        out += page
        if len(page) < 200:
            return out
        offset += 200


def _prefect_records(since, run_ids: list[str]) -> bytes:
    """Every record the Prefect API holds from `since` on: flow runs (their parameters), task runs, logs,
    artifacts, and all variables, as JSON bytes."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter,
                                                FlowRunFilterExpectedStartTime, LogFilter, LogFilterTimestamp,
                                                TaskRunFilter, TaskRunFilterStartTime)

    with get_client(sync_client=True) as client:
        flow_runs = _paged(client.read_flow_runs, flow_run_filter=FlowRunFilter(
            expected_start_time=FlowRunFilterExpectedStartTime(after_=since)))
        assert {f"llm-pipeline/{r}" for r in run_ids} <= {r.name for r in flow_runs}
        ids = [r.id for r in flow_runs]
        records = [r.model_dump(mode="json") for r in flow_runs]
        records += [t.model_dump(mode="json") for t in _paged(client.read_task_runs, task_run_filter=TaskRunFilter(
            start_time=TaskRunFilterStartTime(after_=since)))]
        records += [x.model_dump(mode="json") for x in _paged(client.read_logs, log_filter=LogFilter(
            timestamp=LogFilterTimestamp(after_=since)))]
        records += [a.model_dump(mode="json") for a in _paged(client.read_artifacts, artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=ids)))]
        records += [v.model_dump(mode="json") for v in client.read_variables()]
    return json.dumps(records, default=str, ensure_ascii=False).encode()


@pytest.mark.usefixtures("prefect_server")
def test_no_secret_is_written_anywhere(s3_endpoint, tmp_path, monkeypatch, tally):
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    bucket = "secrets-probe"
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket=bucket)
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_port}/hook/{HOOK_TOKEN}?token={urllib.parse.quote(QUERY_TOKEN)}"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"body": 1}\n[1]\n\xff\n')
    from pipeline_lib.runtime.work_folders import work_folder

    work_before = set(work_folder("data").glob("*"))  # the s3:// data stages' local copies
    common = ["configs/pipelines/tiny-cpu.yaml", "--stages", "data", f"run.output_root=s3://{bucket}/runs",
              f"run.s3_endpoint_url={s3_endpoint}", f"orchestration.failure_webhook_url={hook}",
              "orchestration.retry_delay_seconds=0.1", "data.executor=local"]
    monkeypatch.chdir(ROOT)
    since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5)
    code_ok, out_ok = _cli(["run", *common, "--run-id", "secrets-ok"])
    assert code_ok == 0, out_ok[-3000:]
    code_bad, out_bad = _cli(["run", *common, "--run-id", "secrets-failed", f"data.inputs=[{bad}]"])
    assert code_bad == 1, out_bad[-3000:]
    server.shutdown()
    assert _Hook.received and all(HOOK_TOKEN in path for path, _ in _Hook.received)  # the real URL was used

    scan = Scan()
    objects, keys = 0, []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            scan.scan(f"s3://{bucket}/{obj['Key']}", s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
            objects += 1
            keys.append(obj["Key"])
    assert any("/logs/" in k for k in keys) and any(k.endswith("stats.json") for k in keys)  # logs and outputs
    assert objects > 10
    for folder in set(work_folder("data").glob("*")) - work_before:
        scan.scan_tree(folder, f"work folder {folder}")
    scan.scan("CLI output", (out_ok + out_bad).encode())
    for path, body in _Hook.received:
        scan.scan("webhook payload", body)
    home = Path(os.environ["PREFECT_HOME"])
    scan.scan_tree(home, "PREFECT_HOME")  # the server's SQLite database (+ WAL) and persisted results
    records = _prefect_records(since, ["secrets-ok", "secrets-failed"])
    if os.environ.get("LLM_PIPELINE_SECRETS_DUMP"):  # to see where a leak is
        Path(os.environ["LLM_PIPELINE_SECRETS_DUMP"]).write_bytes(records)
    scan.scan("Prefect API records", records)
    tally.add(RELIABILITY_ROW, scanned_bytes=scan.bytes, scanned_objects=objects, secrets=len(SECRETS),
              found=len(scan.found), presigned_links=scan.presigned_links)
    assert scan.found == [], "\n".join(scan.found)
