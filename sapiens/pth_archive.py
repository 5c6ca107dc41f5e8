"""The zip archives torch writes, as the checkpoint reader sees them (`sapiens.pth_reader`):
records by name, small ones read through zipfile with their CRC checked, tensor storages as
views of the file's memory map, and a zip nested inside another (torch.export's state dict)
read in place. Nothing here unpickles anything."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from typing import Any, BinaryIO

import numpy as np


class ReaderRefusal(Exception):
    """A refusal inside the reader; `read_pth` names the file."""


class _Window(io.RawIOBase):
    """A byte range of an open file as a seekable file, so zipfile can read a zip stored
    inside another (torch.export's nested state dict) without copying it."""

    def __init__(self, fh: BinaryIO, start: int, size: int) -> None:
        super().__init__()
        self._fh, self._start, self._size, self._pos = fh, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        self._fh.seek(self._start + self._pos)
        got = self._fh.readinto(view[:n]) or 0
        self._pos += got
        return got


class TorchZip:
    """One zip archive at [start, start + size) of the file: its records by name, small ones
    read through zipfile (CRC checked), storages as views of the file's memory map."""

    def __init__(
        self, fh: BinaryIO, mm: np.ndarray, start: int, size: int, what: str, verify_crc: bool
    ) -> None:
        self.fh, self.mm, self.start, self.size, self.what = fh, mm, start, size, what
        self.verify_crc = verify_crc
        try:
            self.zf = zipfile.ZipFile(_Window(fh, start, size))
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise ReaderRefusal(
                f"truncated or damaged: {what} starts as a zip archive but its zip directory "
                f"(at the end) is missing or unreadable ({exc}); was the download cut short?"
            ) from None
        self.infos = {info.filename: info for info in self.zf.infolist()}
        self._checked: dict[str, np.ndarray] = {}

    def read(self, name: str) -> bytes:
        try:
            return self.zf.read(name)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, zlib.error) as exc:
            raise ReaderRefusal(f"damaged record {name} in {self.what}: {exc}") from None

    def span(self, name: str) -> tuple[int, int]:
        """Where an uncompressed record's bytes lie in the whole file."""
        info = self.infos[name]
        if info.compress_type != zipfile.ZIP_STORED:
            raise ReaderRefusal(
                f"record {name} is compressed; torch writes tensor data uncompressed"
            )
        at = self.start + info.header_offset
        head = bytes(self.mm[at : at + 30])
        if len(head) < 30 or head[:4] != b"PK\x03\x04":
            raise ReaderRefusal(f"damaged archive: no local header for record {name}")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        begin = at + 30 + name_len + extra_len
        end = begin + info.file_size
        if end > self.start + self.size:
            raise ReaderRefusal(
                f"truncated: record {name} needs bytes up to {end}, "
                f"{self.what} ends at {self.start + self.size}"
            )
        return begin, end

    def raw(self, name: str) -> np.ndarray:
        """A stored record as uint8 (a view of the memory map), its CRC checked once."""
        if name not in self._checked:
            begin, end = self.span(name)
            data = self.mm[begin:end]
            crc = self.infos[name].CRC
            if self.verify_crc and crc and zlib.crc32(data) != crc:
                raise ReaderRefusal(f"record {name} is damaged: its CRC does not match")
            self._checked[name] = data
        return self._checked[name]

    def nested(self, name: str) -> TorchZip:
        begin, end = self.span(name)
        return TorchZip(self.fh, self.mm, begin, end - begin, name, self.verify_crc)

    def folder(self) -> str:
        """The one top folder torch puts every record in ('archive/' or the file's stem)."""
        tops = {name.split("/", 1)[0] for name in self.infos if "/" in name}
        if len(tops) != 1:
            raise ReaderRefusal(
                f"{self.what} is a zip archive but not one torch writes (top folders: "
                f"{sorted(tops)[:5] or 'none'})"
            )
        return f"{tops.pop()}/"

    def byteorder(self, folder: str) -> str:
        """'<' or '>': the `byteorder` record (torch >= 2.1), little-endian without one."""
        name = f"{folder}byteorder"
        if name not in self.infos:
            return "<"
        order = self.read(name).strip()
        if order not in (b"little", b"big"):
            raise ReaderRefusal(f"record {name} says {order[:20]!r}, not little or big")
        return "<" if order == b"little" else ">"
