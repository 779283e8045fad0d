"""A pyarrow filesystem that records the byte ranges read from each file, and the row groups of a
Parquet file that those ranges touched: what a reader really decoded, counted, not timed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


class _Recorded:
    """A file object over a native file that logs each read as (offset, length)."""

    def __init__(self, native: pa.NativeFile, ranges: list[tuple[int, int]], before_read: Callable[[], None]) -> None:
        self._native = native
        self._ranges = ranges
        self._before_read = before_read
        self.closed = False

    def read(self, nbytes: int = -1) -> bytes:
        self._before_read()
        at = self._native.tell()
        data = self._native.read() if nbytes is None or nbytes < 0 else self._native.read(nbytes)
        self._ranges.append((at, len(data)))
        return bytes(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._native.seek(offset, whence))

    def tell(self) -> int:
        return int(self._native.tell())

    def size(self) -> int:
        return int(self._native.size())

    def close(self) -> None:
        self.closed = True
        self._native.close()


class ReadRecorder(pafs.FileSystemHandler):
    """Wraps a filesystem; `ranges[path]` lists the (offset, length) of every read of that file.
    `before_read` runs ahead of each read of a file opened for random access (a hook to pause a
    reader at a known point)."""

    def __init__(self, fs: pafs.FileSystem, before_read: Callable[[], None] = lambda: None) -> None:
        self.fs = fs
        self.before_read = before_read
        self.ranges: dict[str, list[tuple[int, int]]] = {}
        self._lock = threading.Lock()

    def filesystem(self) -> pafs.PyFileSystem:
        return pafs.PyFileSystem(self)

    def row_groups_read(self, path: str) -> list[int]:
        """The row groups of a Parquet file whose column chunks any read overlapped, leaving out
        the read of the footer (the file's last bytes: pyarrow fetches 64 KiB of them at once, which
        may reach into the last row group)."""
        metadata = pq.ParquetFile(path, filesystem=self.fs).metadata
        size = self.fs.get_file_info(path).size
        reads = [(at, n) for at, n in self.ranges.get(path, []) if at + n != size]
        touched = []
        for i in range(metadata.num_row_groups):
            for c in range(metadata.num_columns):
                chunk = metadata.row_group(i).column(c)
                start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
                end = start + chunk.total_compressed_size
                if any(at < end and start < at + n for at, n in reads):
                    touched.append(i)
                    break
        return touched

    def _log(self, path: str) -> list[tuple[int, int]]:
        with self._lock:
            return self.ranges.setdefault(path, [])

    # -- pafs.FileSystemHandler: everything else goes straight to the wrapped filesystem -------------
    def open_input_file(self, path: str) -> pa.PythonFile:
        return pa.PythonFile(_Recorded(self.fs.open_input_file(path), self._log(path), self.before_read), mode="r")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.fs.open_input_stream(path)

    def get_type_name(self) -> str:
        return "read-recorder"

    def normalize_path(self, path: str) -> str:
        return str(self.fs.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return list(self.fs.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return list(self.fs.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise NotImplementedError

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self.fs.open_append_stream(path, metadata=metadata)
