"""One URI-based storage layer over local paths and S3 (or S3-compatible stores).

A URI is either a local path (relative or absolute, or file://) or s3://bucket/key.
Every put is atomic: the object appears under its final name only when it is complete
(local: temp file in the same folder + os.replace; S3: upload to a temp key, server-side
copy, delete the temp key), so a reader never sees a half-written file as done.
"""
from __future__ import annotations

import glob
import hashlib
import io
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import BinaryIO, Iterator

TMP_PREFIX = ".tmp-"
GLOB_CHARS = "*?["


def is_s3(uri: str) -> bool:
    return str(uri).startswith("s3://")


def join(uri: str, *parts: str) -> str:
    uri = str(uri)
    if is_s3(uri):
        return "/".join([uri.rstrip("/"), *[p.strip("/") for p in parts if p]])
    return str(Path(uri, *parts))


def split_s3(uri: str) -> tuple[str, str]:
    rest = uri[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"S3 URI {uri!r} has no bucket; write s3://bucket/prefix")
    return bucket, key


class LocalStore:
    """Local filesystem; `uri` is a path."""

    def _path(self, uri: str) -> Path:
        uri = str(uri)
        return Path(uri[len("file://"):] if uri.startswith("file://") else uri)

    def exists(self, uri: str) -> bool:
        return self._path(uri).exists()

    def size(self, uri: str) -> int:
        return self._path(uri).stat().st_size

    def put_bytes(self, uri: str, data: bytes) -> None:
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.name + ".", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_file(self, local_path: str | Path, uri: str) -> None:
        path = self._path(uri)
        if Path(local_path).resolve() == path.resolve():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f"{TMP_PREFIX}{path.name}.{uuid.uuid4().hex[:8]}"
        try:
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get_bytes(self, uri: str) -> bytes:
        return self._path(uri).read_bytes()

    def get_file(self, uri: str, local_path: str | Path) -> Path:
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        if self._path(uri).resolve() != local_path.resolve():
            shutil.copyfile(self._path(uri), local_path)
        return local_path

    def open_read(self, uri: str) -> BinaryIO:
        return open(self._path(uri), "rb")

    def list(self, prefix: str) -> list[str]:
        """Files under a folder (recursive), sorted, temp files excluded."""
        root = self._path(prefix)
        if root.is_file():
            return [str(root)]
        if not root.exists():
            return []
        return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith(TMP_PREFIX))

    def delete(self, uri: str) -> None:
        path = self._path(uri)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    def local_path(self, uri: str) -> Path | None:
        return self._path(uri)

    def fingerprint(self, uri: str) -> str:
        """sha256 of the content (one streaming read)."""
        digest = hashlib.sha256()
        with open(self._path(uri), "rb") as fh:
            while chunk := fh.read(8 << 20):
                digest.update(chunk)
        return "sha256:" + digest.hexdigest()


class S3Store:
    """S3 through boto3; endpoint_url makes MinIO, OBS or moto work the same way."""

    def __init__(self, endpoint_url: str | None = None):
        import boto3
        from botocore.config import Config

        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint_url,
            config=Config(retries={"max_attempts": 5, "mode": "standard"}),
        )

    def exists(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return bool(self.list(uri.rstrip("/") + "/"))
            raise

    def size(self, uri: str) -> int:
        bucket, key = split_s3(uri)
        return self.client.head_object(Bucket=bucket, Key=key)["ContentLength"]

    def _commit(self, bucket: str, tmp_key: str, key: str) -> None:
        try:
            self.client.copy({"Bucket": bucket, "Key": tmp_key}, bucket, key)
        finally:
            self.client.delete_object(Bucket=bucket, Key=tmp_key)

    def _tmp_key(self, key: str) -> str:
        head, _, name = key.rpartition("/")
        return f"{head}/{TMP_PREFIX}{name}.{uuid.uuid4().hex[:8]}" if head else f"{TMP_PREFIX}{name}.{uuid.uuid4().hex[:8]}"

    def put_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = split_s3(uri)
        tmp = self._tmp_key(key)
        self.client.upload_fileobj(io.BytesIO(data), bucket, tmp)
        self._commit(bucket, tmp, key)

    def put_file(self, local_path: str | Path, uri: str) -> None:
        bucket, key = split_s3(uri)
        tmp = self._tmp_key(key)
        self.client.upload_file(str(local_path), bucket, tmp)
        self._commit(bucket, tmp, key)

    def get_bytes(self, uri: str) -> bytes:
        bucket, key = split_s3(uri)
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def get_file(self, uri: str, local_path: str | Path) -> Path:
        bucket, key = split_s3(uri)
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(bucket, key, str(local_path))
        return local_path

    def open_read(self, uri: str) -> BinaryIO:
        """A streaming body: bytes arrive as they are read, nothing is downloaded first."""
        bucket, key = split_s3(uri)
        return self.client.get_object(Bucket=bucket, Key=key)["Body"]

    def list(self, prefix: str) -> list[str]:
        bucket, key = split_s3(prefix)
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for obj in page.get("Contents", []):
                if not obj["Key"].rsplit("/", 1)[-1].startswith(TMP_PREFIX):
                    out.append(f"s3://{bucket}/{obj['Key']}")
        return sorted(out)

    def delete(self, uri: str) -> None:
        bucket, key = split_s3(uri)
        keys = [split_s3(u)[1] for u in self.list(uri.rstrip("/") + "/")] or [key]
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})

    def local_path(self, uri: str) -> None:
        return None

    def fingerprint(self, uri: str) -> str:
        """The object's ETag: a content hash kept by the server (no download)."""
        bucket, key = split_s3(uri)
        return "etag:" + self.client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')


_S3_CLIENTS: dict[str | None, S3Store] = {}


def store_for(uri: str, endpoint_url: str | None = None) -> LocalStore | S3Store:
    if is_s3(uri):
        if endpoint_url not in _S3_CLIENTS:
            _S3_CLIENTS[endpoint_url] = S3Store(endpoint_url)
        return _S3_CLIENTS[endpoint_url]
    return LocalStore()


def has_glob(pattern: str) -> bool:
    return any(c in pattern for c in GLOB_CHARS)


def glob_regex(pattern: str) -> re.Pattern:
    """A glob as a regex over '/'-separated keys: `*` and `?` stay within one path segment,
    `**` spans any number of segments (`a/**/b` matches `a/b` too), `[...]` is a character class
    (`[!...]` negated)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and _class_end(pattern, i) > 0:
            end = _class_end(pattern, i)
            body = pattern[i + 1:end].replace("\\", "\\\\")
            body = "^/" + body[1:] if body.startswith("!") else ("\\" + body if body.startswith("^") else body)
            out.append("[" + body + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _class_end(pattern: str, i: int) -> int:
    """Index of the ']' closing the character class opened at i, or -1 (then '[' is literal)."""
    j = i + 1
    j += pattern.startswith("!", j)
    j += pattern.startswith("]", j)  # a leading ']' is a member
    return pattern.find("]", j)


def list_matching(pattern: str, endpoint_url: str | None = None) -> list[str]:
    """Every file a pattern names, sorted, temp files excluded. The one lister of the project:
    - a file or object: itself;
    - a local folder, or an s3:// prefix read as a folder (s3://b/raw = s3://b/raw/): every file
      under it, recursively;
    - a glob (local or s3://): `*`, `?`, `[...]` match within one path segment, `**` any depth.
    Local results are absolute paths; S3 results are s3://bucket/key URIs. Nothing matched: []."""
    pattern = str(pattern)
    if is_s3(pattern):
        store = store_for(pattern, endpoint_url)
        bucket, key = split_s3(pattern)
        if not has_glob(key):
            if key and not key.endswith("/") and _s3_object_exists(store, pattern):
                return [pattern]
            return store.list(f"s3://{bucket}/{key.rstrip('/')}/" if key.strip("/") else f"s3://{bucket}/")
        literal = re.split(r"[*?\[]", key, maxsplit=1)[0]  # list only under the literal head
        regex = glob_regex(key)
        return [u for u in store.list(f"s3://{bucket}/{literal}") if regex.match(split_s3(u)[1])]
    path = pattern[len("file://"):] if pattern.startswith("file://") else pattern
    found: list[str] = []
    for p in sorted(glob.glob(path, recursive=True)) if has_glob(path) else [path]:
        if os.path.isdir(p):
            found += LocalStore().list(p)
        elif os.path.isfile(p) and not os.path.basename(p).startswith(TMP_PREFIX):
            found.append(p)
    return sorted({os.path.abspath(p) for p in found})


def _s3_object_exists(store: "S3Store", uri: str) -> bool:
    from botocore.exceptions import ClientError

    bucket, key = split_s3(uri)
    try:
        store.client.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def iter_lines(fh: BinaryIO) -> Iterator[bytes]:
    """Lines of a binary stream without reading it whole (works on S3 streaming bodies)."""
    pending = b""
    while True:
        chunk = fh.read(1 << 20)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from lines
    if pending:
        yield pending
