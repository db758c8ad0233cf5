"""One URI-based storage layer over local paths and S3 (or S3-compatible stores).

A URI is either a local path (relative or absolute, or file://) or s3://bucket/key.
Every put is atomic: the object appears under its final name only when it is complete
(local: temp file in the same folder + os.replace; S3: upload to a temp key, server-side
copy, delete the temp key), so a reader never sees a half-written file as done.

`store_for(uri)` gives the store a URI lives in; callers ask it, not the URI scheme: `store.remote`
(must files be uploaded / downloaded?), `open_range` / `open_seekable` (ranged reads, no whole
download), `glob` (files, folders and `*`/`**` patterns), `put_new` (create only if absent: the
compare-and-swap that storage.generations builds on). Only this package branches on s3:// or
talks to boto3.

S3 failures: botocore retries every request (mode, attempts and timeouts from `S3Settings`: the
LLM_PIPELINE_S3_* environment variables); a body cut short on a streaming read is read again from
where it broke (a ranged GET). What still fails after that raises `StorageUnavailable` (a
ConnectionError, so Prefect tasks retry it), naming the operation, the URI and what to do.
"""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from functools import wraps
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


def is_remote(uri: str) -> bool:
    """A URI on an object store (another machine's disk), as opposed to this machine's file system: what a
    caller asks instead of testing the scheme itself."""
    return is_s3(uri)


def is_absolute(uri: str) -> bool:
    """A URI that names a place by itself (s3://..., file://..., /abs/path), as opposed to a path
    relative to some folder."""
    uri = str(uri)
    return is_s3(uri) or uri.startswith("file://") or Path(uri).is_absolute()


def _scan(folder: str) -> list[os.DirEntry]:
    """A folder's entries; [] when it cannot be read (as glob.glob: a pattern names what it can see)."""
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def _first_visit(path: str, follow: bool, seen: set, tag=None) -> bool:
    """Whether the folder at path (its device and inode) is not in `seen` yet; adds it."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError:
        return False
    key = (st.st_dev, st.st_ino, tag)
    if key in seen:
        return False
    seen.add(key)
    return True


def _files_under(root: str, follow: bool, seen: set) -> list[str]:
    """Every file under folder `root` (itself followed), temp files excluded; links skipped unless
    `follow`; a folder already in `seen` is not listed again."""
    out, todo = [], [root] if _first_visit(root, True, seen) else []
    while todo:
        for entry in _scan(todo.pop()):
            if entry.is_symlink() and not follow:
                continue
            try:
                if entry.is_dir(follow_symlinks=follow):
                    if _first_visit(entry.path, follow, seen):
                        todo.append(entry.path)
                elif entry.is_file(follow_symlinks=follow) and not entry.name.startswith(TMP_PREFIX):
                    out.append(entry.path)
            except OSError:  # a dangling link, or gone meanwhile
                continue
    return out


def _glob_local(path: str, follow: bool) -> Iterator[str]:
    """Paths (files and folders) a local glob matches, segment by segment as glob.glob does, but with
    the link policy of LocalStore.glob and a visited set for `**` (glob.glob follows links into
    folders, so two links to `.` made it walk 2**40 paths)."""
    segs = path.split(os.sep)
    lead = next((i for i, seg in enumerate(segs) if has_glob(seg)), len(segs))
    base = os.sep.join(segs[:lead]) or (os.sep if path.startswith(os.sep) else os.curdir)
    if not os.path.isdir(base):
        return
    yield from _match(base, segs[lead:], follow, set())


def _match(base: str, segs: list[str], follow: bool, seen: set) -> Iterator[str]:
    if not segs:
        yield base
        return
    seg, rest = segs[0], segs[1:]
    if seg == "**":
        yield from _match(base, rest, follow, seen)  # no folder at all
        for entry in _scan(base):
            if (not entry.name.startswith(".") and not (entry.is_symlink() and not follow)
                    and entry.is_dir(follow_symlinks=follow) and _first_visit(entry.path, follow, seen, len(segs))):
                yield from _match(entry.path, segs, follow, seen)
    elif has_glob(seg):
        for entry in _scan(base):
            if entry.name.startswith(".") and not seg.startswith("."):
                continue
            if not fnmatch.fnmatchcase(entry.name, seg) or (entry.is_symlink() and not follow):
                continue
            if not rest or entry.is_dir(follow_symlinks=follow):
                yield from _match(entry.path, rest, follow, seen)
    elif seg == "":  # a trailing or doubled separator
        yield from _match(base, rest, follow, seen)
    else:  # a literal segment after a wildcard: named by the user, followed as typed
        child = os.path.join(base, seg)
        if os.path.lexists(child):
            yield from _match(child, rest, follow, seen)


class LocalStore:
    """Local filesystem; `uri` is a path."""

    remote = False  # files are on this machine: local_path() works, no upload/download step

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

    def put_new(self, uri: str, data: bytes | str | Path) -> bool:
        """Create `uri` only if nothing is there (bytes, or a local file's path): True when this call
        wrote it, False when it already existed. Atomic: the content is written to a temp file first
        and os.link'ed to the final name, which fails if the name exists (no lock, no lost update)."""
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.name + ".", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                if isinstance(data, bytes):
                    fh.write(data)
                else:
                    with open(data, "rb") as src:
                        shutil.copyfileobj(src, fh, 8 << 20)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)

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

    def open_range(self, uri: str, start: int, end: int | None = None) -> BinaryIO:
        """Bytes [start, end) of a file as a stream (end None: to the end)."""
        fh = self.open_read(uri)
        fh.seek(start)
        return fh if end is None else _Limited(fh, max(end - start, 0))

    def open_seekable(self, uri: str) -> BinaryIO:
        """A seekable file (for readers that jump around, e.g. parquet footers and row groups)."""
        return self.open_read(uri)

    def list(self, prefix: str) -> list[str]:
        """Files under a folder (recursive), sorted, temp files excluded."""
        root = self._path(prefix)
        if root.is_file():
            return [str(root)]
        if not root.exists():
            return []
        return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith(TMP_PREFIX))

    def glob(self, pattern: str, follow_symlinks: bool = False) -> list[str]:
        """Every file a pattern names, sorted, temp files excluded, as absolute paths: a file itself;
        a folder: every file under it, recursively; a glob: `*`, `?`, `[...]` match within one path
        segment (not a leading dot, as glob.glob), `**` any depth. Nothing matched: [].
        Symbolic links met while listing a folder or matching a wildcard are skipped unless
        follow_symlinks (a link may lead out of the folder, into files its owner did not mean to
        give); the path's literal part is always followed. Each real folder is listed once (a
        visited set of device and inode), so a link loop cannot make listing endless."""
        path = str(self._path(pattern))
        found: list[str] = []
        listed: set = set()
        for p in _glob_local(path, follow_symlinks) if has_glob(path) else [path]:
            if os.path.isdir(p):
                found += _files_under(p, follow_symlinks, listed)
            elif os.path.isfile(p) and not os.path.basename(p).startswith(TMP_PREFIX):
                found.append(p)
        return sorted({os.path.abspath(p) for p in found})

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """{path: size} of the regular files under a folder, recursively, temp files included (what a folder
        holds on disk); symbolic links are neither followed nor listed (nothing outside the folder is seen)."""
        out, todo = {}, [str(self._path(prefix))]
        while todo:
            for entry in _scan(todo.pop()):
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    out[entry.path] = entry.stat(follow_symlinks=False).st_size
        return dict(sorted(out.items()))

    def delete(self, uri: str) -> None:
        path = self._path(uri)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    def local_path(self, uri: str) -> Path | None:
        return self._path(uri)

    def share_url(self, uri: str, expires_s: int = 7 * 24 * 3600) -> None:
        """No URL a browser may open: pages refuse file:// links, so callers show the path as text."""
        return None

    def fingerprint(self, uri: str) -> str:
        """sha256 of the content (one streaming read)."""
        digest = hashlib.sha256()
        with open(self._path(uri), "rb") as fh:
            while chunk := fh.read(8 << 20):
                digest.update(chunk)
        return "sha256:" + digest.hexdigest()


@dataclass(frozen=True)
class S3Settings:
    """How hard the S3 client tries before a storage operation fails (read from the environment, so
    one setting reaches every process of a run: CLI, Prefect workers, training launchers).

    LLM_PIPELINE_S3_MAX_ATTEMPTS   attempts per request, the first included (default 8; AWS_MAX_ATTEMPTS
                                   is honoured when ours is unset). Retried: 5xx, SlowDown/throttling,
                                   connection resets, timeouts (botocore's "standard" mode, exponential
                                   backoff with jitter, at most 20 s between attempts).
    LLM_PIPELINE_S3_RETRY_MODE     standard (default) or adaptive (also rate-limits this client).
    LLM_PIPELINE_S3_CONNECT_TIMEOUT / LLM_PIPELINE_S3_READ_TIMEOUT   seconds (defaults 10 / 60): a
                                   stalled connection is abandoned (and retried) after this long.
    """

    max_attempts: int = 8
    retry_mode: str = "standard"
    connect_timeout: float = 10.0
    read_timeout: float = 60.0

    @classmethod
    def from_env(cls) -> "S3Settings":
        env = os.environ

        def number(name: str, default, kind):
            raw = env.get(name)
            if raw in (None, ""):
                return default
            try:
                value = kind(raw)
            except ValueError:
                value = None
            if value is None or value <= 0:
                raise ValueError(f"{name}={raw!r} is not a positive number. Fix: set it to e.g. {default}, or unset it")
            return value

        attempts = number("LLM_PIPELINE_S3_MAX_ATTEMPTS", number("AWS_MAX_ATTEMPTS", cls.max_attempts, int), int)
        mode = env.get("LLM_PIPELINE_S3_RETRY_MODE") or cls.retry_mode
        if mode not in ("standard", "adaptive", "legacy"):
            raise ValueError(f"LLM_PIPELINE_S3_RETRY_MODE={mode!r} is not a botocore retry mode. "
                             "Fix: set it to standard or adaptive")
        return cls(attempts, mode, number("LLM_PIPELINE_S3_CONNECT_TIMEOUT", cls.connect_timeout, float),
                   number("LLM_PIPELINE_S3_READ_TIMEOUT", cls.read_timeout, float))


class StorageUnavailable(ConnectionError):
    """An S3 operation still failed after every retry (network, timeouts, 5xx, throttling)."""

    def __init__(self, op: str, uri: str, store: "S3Store", cause: BaseException):
        s, write = store.settings, op in ("upload", "write", "create")
        reason = f"{type(cause).__name__}: {cause}".replace("\n", " ")[:300]
        super().__init__(
            f"S3 {op} of {uri} failed after {s.max_attempts} attempts per request (endpoint "
            f"{store.endpoint_url or 'AWS default'}): {reason}."
            + (" Nothing half-written is visible under that key." if write else "")
            + " Fix: check that the endpoint is reachable and not throttling (run.s3_endpoint_url), then run the "
            "same run id again (finished stages are not redone); for a flaky link raise "
            f"LLM_PIPELINE_S3_MAX_ATTEMPTS (now {s.max_attempts}) or LLM_PIPELINE_S3_READ_TIMEOUT (now "
            f"{s.read_timeout:g} s)")
        self.op, self.uri = op, uri


_RETRYABLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                    "InternalError", "ServiceUnavailable", "503", "500", "RequestLimitExceeded"}


def _unavailable(err: BaseException) -> bool:
    """A failure of the link or the server (worth another try later), not of the request itself."""
    from botocore.exceptions import BotoCoreError, ClientError
    from urllib3.exceptions import HTTPError as Urllib3Error

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, ClientError):
            meta = err.response.get("ResponseMetadata", {})
            return (meta.get("HTTPStatusCode") or 0) >= 500 or err.response.get("Error", {}).get("Code") in _RETRYABLE_CODES
        if isinstance(err, (BotoCoreError, Urllib3Error, ConnectionError, TimeoutError)) and not isinstance(
                err, StorageUnavailable):
            from botocore.exceptions import NoCredentialsError, ParamValidationError
            return not isinstance(err, (NoCredentialsError, ParamValidationError))
        err = err.__cause__ or err.__context__  # boto3's S3UploadFailedError wraps the ClientError
    return False


def _s3_op(op: str, uri_arg: int = 0):
    """Turn a failure that outlived botocore's retries into StorageUnavailable(op, uri)."""
    def wrap(method):
        @wraps(method)
        def run(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except StorageUnavailable:
                raise
            except Exception as err:
                if _unavailable(err):
                    raise StorageUnavailable(op, str(args[uri_arg]) if len(args) > uri_arg else "?", self, err) from err
                raise
        return run
    return wrap


class S3Store:
    """S3 through boto3; endpoint_url makes MinIO, OBS or moto work the same way."""

    remote = True

    def __init__(self, endpoint_url: str | None = None, settings: S3Settings | None = None):
        import boto3
        from botocore.config import Config

        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        self.settings = settings or S3Settings.from_env()
        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint_url,
            config=Config(retries={"total_max_attempts": self.settings.max_attempts, "mode": self.settings.retry_mode},
                          connect_timeout=self.settings.connect_timeout, read_timeout=self.settings.read_timeout),
        )

    @_s3_op("check")
    def exists(self, uri: str) -> bool:
        """An object, or a non-empty prefix read as a folder."""
        bucket, key = split_s3(uri)
        return self._object_exists(bucket, key) or bool(self.list(uri.rstrip("/") + "/"))

    @_s3_op("head")
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

    def _upload_then_commit(self, upload, bucket: str, key: str) -> None:
        """Upload to a temp key (a multipart upload above 8 MB: nothing is visible until it completes),
        then copy to the final key. A failed upload leaves nothing under the final key, and its temp
        object is deleted when the store still answers."""
        tmp = self._tmp_key(key)
        try:
            upload(tmp)
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.delete_object(Bucket=bucket, Key=tmp)
            raise
        self._commit(bucket, tmp, key)

    @_s3_op("write")
    def put_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = split_s3(uri)
        self._upload_then_commit(lambda tmp: self.client.upload_fileobj(io.BytesIO(data), bucket, tmp), bucket, key)

    @_s3_op("upload", uri_arg=1)
    def put_file(self, local_path: str | Path, uri: str) -> None:
        bucket, key = split_s3(uri)
        self._upload_then_commit(lambda tmp: self.client.upload_file(str(local_path), bucket, tmp), bucket, key)

    @_s3_op("create")
    def put_new(self, uri: str, data: bytes | str | Path) -> bool:
        """Create `uri` only if no object is there (bytes, or a local file's path): True when this
        call wrote it, False when it already existed. One PUT with If-None-Match: * (the server
        decides; at most 5 GB), so two writers of the same key never both succeed."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        body = data if isinstance(data, bytes) else open(data, "rb")
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
            return True
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                # A retried PUT whose first answer was lost finds its own object: the same bytes are
                # this call's write (and any writer of identical bytes wanted the very same value).
                return self._holds(bucket, key, data)
            raise
        finally:
            if not isinstance(body, bytes):
                body.close()

    def _holds(self, bucket: str, key: str, data: bytes | str | Path) -> bool:
        """Whether the object at key has exactly these bytes (a local file's path, or bytes)."""
        from botocore.exceptions import ClientError

        size = len(data) if isinstance(data, bytes) else Path(data).stat().st_size
        try:
            if self.client.head_object(Bucket=bucket, Key=key)["ContentLength"] != size:
                return False
        except ClientError:
            return False
        want = hashlib.sha256(data).hexdigest() if isinstance(data, bytes) else _sha256_path(data)
        digest = hashlib.sha256()
        with _ResumingBody(self, bucket, key, 0, None) as fh:
            while chunk := fh.read(8 << 20):
                digest.update(chunk)
        return digest.hexdigest() == want

    @_s3_op("read")
    def get_bytes(self, uri: str) -> bytes:
        with self.open_read(uri) as fh:  # a body cut short is read on from where it broke
            return fh.read()

    @_s3_op("download")
    def get_file(self, uri: str, local_path: str | Path) -> Path:
        bucket, key = split_s3(uri)
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(bucket, key, str(local_path))
        return local_path

    @_s3_op("read")
    def open_read(self, uri: str) -> BinaryIO:
        """A streaming body: bytes arrive as they are read, nothing is downloaded first."""
        bucket, key = split_s3(uri)
        return _ResumingBody(self, bucket, key, 0, None)

    @_s3_op("ranged read")
    def open_range(self, uri: str, start: int, end: int | None = None) -> BinaryIO:
        """Bytes [start, end) of an object, one ranged GET streamed as it is read."""
        if end is not None and end <= start:
            return io.BytesIO(b"")
        bucket, key = split_s3(uri)
        return _ResumingBody(self, bucket, key, start, end)

    def open_seekable(self, uri: str) -> BinaryIO:
        """A seekable, buffered file over the object: each buffer fill is one ranged GET."""
        return io.BufferedReader(_S3RangeFile(self, uri), buffer_size=1 << 20)

    @_s3_op("list")
    def list(self, prefix: str) -> list[str]:
        bucket, key = split_s3(prefix)
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for obj in page.get("Contents", []):
                if not obj["Key"].rsplit("/", 1)[-1].startswith(TMP_PREFIX):
                    out.append(f"s3://{bucket}/{obj['Key']}")
        return sorted(out)

    @_s3_op("list")
    def glob(self, pattern: str, follow_symlinks: bool = False) -> list[str]:
        """Every object a pattern names, sorted, temp objects excluded, as s3:// URIs: an object
        itself; a prefix read as a folder (s3://b/raw = s3://b/raw/): every object under it; a glob
        (same rules as LocalStore.glob) over keys. Nothing matched: []. S3 has no links: follow_symlinks
        changes nothing."""
        bucket, key = split_s3(pattern)
        if not has_glob(key):
            if key and not key.endswith("/") and self._object_exists(bucket, key):
                return [pattern]
            return self.list(f"s3://{bucket}/{key.rstrip('/')}/" if key.strip("/") else f"s3://{bucket}/")
        literal = re.split(r"[*?\[]", key, maxsplit=1)[0]  # list only under the literal head
        regex = glob_regex(key)
        return [u for u in self.list(f"s3://{bucket}/{literal}") if regex.match(split_s3(u)[1])]

    def _object_exists(self, bucket: str, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    @_s3_op("list")
    def list_sizes(self, prefix: str) -> dict[str, int]:
        """{uri: size} of the objects under a prefix (one listing, no HEAD per object), temp objects included."""
        bucket, key = split_s3(prefix)
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for obj in page.get("Contents", []):
                out[f"s3://{bucket}/{obj['Key']}"] = int(obj["Size"])
        return dict(sorted(out.items()))

    @_s3_op("delete")
    def delete_objects(self, uris: list[str]) -> None:
        """Delete exactly these objects (never what lies under them as a prefix, unlike delete)."""
        by_bucket: dict[str, list[str]] = {}
        for uri in uris:
            bucket, key = split_s3(uri)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})

    @_s3_op("delete")
    def delete(self, uri: str) -> None:
        bucket, key = split_s3(uri)
        keys = [split_s3(u)[1] for u in self.list(uri.rstrip("/") + "/")] or [key]
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})

    def local_path(self, uri: str) -> None:
        return None

    def share_url(self, uri: str, expires_s: int = 7 * 24 * 3600) -> str | None:
        """A presigned HTTPS (or the endpoint's scheme) GET URL for one object, valid expires_s seconds
        (7 days, the SigV4 maximum): a link in the Prefect UI that opens without credentials. It names
        the access key id (every presigned URL does), never the secret key.

        None with temporary credentials (AWS_SESSION_TOKEN: an assumed role, SSO, an instance profile):
        their URL must carry the session token itself (X-Amz-Security-Token), and artifacts are read by
        everyone who can open the Prefect UI, long after the run; such a link also dies with the
        session (often an hour), not after its 7 days. Callers then show the s3:// URI as text."""
        bucket, key = split_s3(uri)
        url = self.client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                                 ExpiresIn=min(int(expires_s), 7 * 24 * 3600))
        return None if "x-amz-security-token=" in url.lower() else url

    @_s3_op("head")
    def fingerprint(self, uri: str) -> str:
        """The object's ETag: a content hash kept by the server (no download)."""
        bucket, key = split_s3(uri)
        return "etag:" + self.client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')


class _ResumingBody(io.RawIOBase):
    """Bytes [start, end) of an S3 object (end None: to its end), streamed as they are read. When the
    body breaks off (a reset, a short read, a stalled link), the rest is fetched again by a ranged GET
    from where it broke, pinned to the same object version (If-Match its ETag), up to the client's
    max_attempts times; then the error is raised (S3Store turns it into StorageUnavailable)."""

    def __init__(self, store: "S3Store", bucket: str, key: str, start: int, end: int | None):
        self.store, self.bucket, self.key, self.pos, self.end = store, bucket, key, start, end
        self.retries_left, self.etag, self.body = store.settings.max_attempts - 1, None, None
        self._open()

    def _open(self) -> None:
        if self.end is not None and self.pos >= self.end:
            self.body = io.BytesIO(b"")
            return
        kwargs = {"IfMatch": self.etag} if self.etag else {}
        if self.pos or self.end is not None:  # no Range for a whole read: an empty object has no byte 0
            kwargs["Range"] = f"bytes={self.pos}-" + ("" if self.end is None else str(self.end - 1))
        resp = self.store.client.get_object(Bucket=self.bucket, Key=self.key, **kwargs)
        self.etag, self.body = self.etag or resp.get("ETag"), resp["Body"]

    def readable(self):
        return True

    def read(self, size: int = -1) -> bytes:
        while True:
            try:
                data = self.body.read() if size is None or size < 0 else self.body.read(size)
            except Exception as err:
                if not _unavailable(err):
                    raise
                if self.retries_left <= 0:
                    raise StorageUnavailable("read", f"s3://{self.bucket}/{self.key}", self.store, err) from err
                self.retries_left -= 1
                with contextlib.suppress(Exception):
                    self.body.close()
                try:
                    self._open()
                except Exception as again:
                    if _unavailable(again):
                        raise StorageUnavailable("read", f"s3://{self.bucket}/{self.key}", self.store, again) from again
                    raise
                continue
            self.pos += len(data)
            return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def close(self):
        if self.body is not None:
            with contextlib.suppress(Exception):
                self.body.close()
        super().close()


class _Limited(io.RawIOBase):
    """At most `n` bytes of a binary stream."""

    def __init__(self, fh, n: int):
        self.fh, self.left = fh, n

    def readable(self):
        return True

    def read(self, size: int = -1) -> bytes:
        size = self.left if size is None or size < 0 else min(size, self.left)
        data = self.fh.read(size) if size else b""
        self.left -= len(data)
        return data

    def close(self):
        self.fh.close()
        super().close()


class _S3RangeFile(io.RawIOBase):
    """A seekable read-only file over an S3 object: each read is one ranged GET."""

    def __init__(self, store: S3Store, uri: str):
        self.store, self.uri = store, uri
        self.length, self.pos = store.size(uri), 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.length + offset}[whence]
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.length - self.pos)
        if n <= 0:
            return 0
        body = self.store.open_range(self.uri, self.pos, self.pos + n).read()
        buf[:len(body)] = body
        self.pos += len(body)
        return len(body)


_S3_CLIENTS: dict[tuple[str | None, S3Settings], S3Store] = {}


def store_for(uri: str, endpoint_url: str | None = None) -> LocalStore | S3Store:
    if is_s3(uri):
        key = (endpoint_url, S3Settings.from_env())  # a changed setting gets its own client
        if key not in _S3_CLIENTS:
            _S3_CLIENTS[key] = S3Store(endpoint_url, key[1])
        return _S3_CLIENTS[key]
    return LocalStore()


def _sha256_path(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


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


def list_matching(pattern: str, endpoint_url: str | None = None, follow_symlinks: bool = False) -> list[str]:
    """Every file a pattern names (see LocalStore.glob / S3Store.glob), from the store it lives in."""
    return store_for(str(pattern), endpoint_url).glob(str(pattern), follow_symlinks)


@dataclass(frozen=True)
class LongLine:
    """A line longer than iter_lines' `max_line` bounds: its first `head` bytes and its whole length.
    The rest of it was read past, never held."""

    head: bytes
    size: int


def iter_lines(fh: BinaryIO, max_line: int | None = None, head: int = 1 << 16) -> Iterator[bytes | LongLine]:
    """Lines of a binary stream without reading it whole (works on S3 streaming bodies), in time
    linear in the stream's length: each chunk is split once, and a line spanning chunks is kept as
    a list of its pieces (joined once), never re-split. With `max_line`, a line longer than that
    many bytes comes back as a LongLine (its first `head` bytes and its length) and is streamed
    past: at most max_line bytes of it are ever held."""
    parts: list[bytes] = []  # pieces of the line still open at the end of the last chunk
    size = 0  # its length so far
    cut: bytes | None = None  # its head, once it is known to be too long
    while chunk := fh.read(1 << 20):
        lines = chunk.split(b"\n")
        for i, piece in enumerate(lines):
            size += len(piece)
            if cut is None and max_line is not None and size > max_line:
                cut, parts = b"".join([*parts, piece[:head]])[:head], []
            if i == len(lines) - 1:  # no newline after it yet: the line goes on in the next chunk
                if cut is None and piece:
                    parts.append(piece)
                break
            if cut is not None:
                yield LongLine(cut, size)
            else:
                yield b"".join([*parts, piece]) if parts else piece
            parts, size, cut = [], 0, None
    if cut is not None:
        yield LongLine(cut, size)
    elif size:
        yield b"".join(parts)
