"""URI storage (local + S3) with atomic writes, and stage manifests.

Also, imported by name: `input_files` (input entries -> files by kind, opening parquet) and
`mindrecord` (MindRecord files of int32 columns), the file formats the data stage and SFT share."""
from .manifest import (Manifest, RunPaths, describe_file, describe_files, describe_local, describe_outputs,
                       invalidate, manifest_matches, read_manifest, sha256_file, write_manifest)
from .store import LocalStore, LongLine, S3Store, is_absolute, is_s3, iter_lines, join, list_matching, store_for

__all__ = ["LocalStore", "S3Store", "Manifest", "RunPaths", "describe_file", "describe_files", "describe_local",
           "describe_outputs", "invalidate", "is_absolute", "is_s3", "iter_lines", "LongLine", "join", "list_matching",
           "manifest_matches", "read_manifest", "sha256_file", "store_for", "write_manifest"]
