"""Columnar chunk codec: a closed interval of one table's rows as one blob, decoded exactly as written.

Format 1 (docs/store.md): one version byte, then zlib of: varint rows, varint columns, each column's name
(varint length + UTF-8), then each column as a kind byte (bit 0x80: a NULL bitmap follows) and its values:

  INT    integers: first or second differences (delta-of-delta suits timestamps), zigzag varints
  SCALED floats that are all m / 10**k for integer m (a value printed with k decimals): m as INT
  XOR    any other floats: each IEEE-754 bit pattern XOR the previous, bytes transposed (the zero high
         bytes of slowly changing values then compress away)
  JSON   anything else (text, mixed types): a JSON list (exact for str, int and float, NaN included)

Every value decodes to the same Python value and type it was read as, so SQLite stores it back the same.
Scaling is used only after checking that every value round-trips bit for bit (-0.0 and NaN take XOR).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Sequence
from typing import Any

FORMAT = 1
_NULLS = 0x80
_ALL_NULL, _INT, _SCALED, _XOR, _JSON = 0, 1, 2, 3, 4
_MAX_SCALE = 6


class CodecError(ValueError):
    """A blob this codec cannot read (a newer format, or damage)."""


def _varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(out: bytearray, n: int) -> None:
    _varint(out, (n << 1) if n >= 0 else ((-n) << 1) - 1)


class _Buf:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def varint(self) -> int:
        n = shift = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) if not n & 1 else -((n + 1) >> 1)

    def take(self, k: int) -> bytes:
        b = self.data[self.pos:self.pos + k]
        if len(b) != k:
            raise CodecError("chunk is truncated")
        self.pos += k
        return b


def _ints(out: bytearray, xs: list[int]) -> None:
    """Mode byte (1: deltas, 2: delta-of-deltas) then zigzag varints; the shorter of the two."""
    best = None
    for order in (1, 2):
        buf = bytearray([order])
        prev, prev_d = 0, 0
        for x in xs:
            d = x - prev
            _zigzag(buf, d if order == 1 else d - prev_d)
            prev, prev_d = x, d
        if best is None or len(buf) < len(best):
            best = buf
    out += best


def _read_ints(b: _Buf, n: int) -> list[int]:
    order = b.take(1)[0]
    out, prev, prev_d = [], 0, 0
    for _ in range(n):
        d = b.zigzag() + (prev_d if order == 2 else 0)
        prev += d
        prev_d = d
        out.append(prev)
    return out


def _scale_of(xs: list[float]) -> tuple[int, list[int]] | None:
    """(k, [m]) when every x is exactly m / 10**k, else None."""
    for k in range(_MAX_SCALE + 1):
        p = 10 ** k
        ms = []
        for x in xs:
            if not math.isfinite(x) or abs(x) * p >= 2 ** 53 or (x == 0 and math.copysign(1.0, x) < 0):
                return None
            m = round(x * p)
            if m / p != x:
                break
            ms.append(m)
        else:
            return k, ms
    return None


def encode(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> bytes:
    """Rows (tuples in `columns` order) as one blob. Raises CodecError for a value it cannot keep exactly."""
    out = bytearray()
    _varint(out, len(rows))
    _varint(out, len(columns))
    for name in columns:
        raw = name.encode()
        _varint(out, len(raw))
        out += raw
    for i in range(len(columns)):
        col = [r[i] for r in rows]
        vals = [v for v in col if v is not None]
        nulls = len(vals) != len(col)
        types = {type(v) for v in vals}
        if not vals:
            out.append(_ALL_NULL)
            continue
        if types == {int}:
            kind, body = _INT, bytearray()
            _ints(body, vals)
        elif types == {float} and (scaled := _scale_of(vals)) is not None:
            kind, body = _SCALED, bytearray([scaled[0]])
            _ints(body, scaled[1])
        elif types == {float}:
            kind, body = _XOR, bytearray()
            bits = struct.unpack(f"<{len(vals)}q", struct.pack(f"<{len(vals)}d", *vals))
            prev, xors = 0, []
            for x in bits:
                xors.append(x ^ prev)
                prev = x
            packed = struct.pack(f">{len(xors)}q", *xors)
            for byte in range(8):  # transposed: every value's first byte, then every second byte, ...
                body += packed[byte::8]
        else:
            if not types <= {int, float, str}:
                raise CodecError(f"column {columns[i]}: values of type {', '.join(sorted(t.__name__ for t in types))}")
            kind, body = _JSON, bytearray()
            text = json.dumps(vals, separators=(",", ":")).encode()
            _varint(body, len(text))
            body += text
        out.append(kind | (_NULLS if nulls else 0))
        if nulls:
            bitmap = bytearray((len(col) + 7) // 8)
            for j, v in enumerate(col):
                if v is None:
                    bitmap[j >> 3] |= 1 << (j & 7)
            out += bitmap
        out += body
    return bytes([FORMAT]) + zlib.compress(bytes(out), 9)


def decode(blob: bytes) -> tuple[list[str], list[tuple]]:
    """(column names, rows) exactly as given to encode()."""
    if not blob or blob[0] != FORMAT:
        raise CodecError(f"chunk format {blob[0] if blob else 'empty'} is not one this lynxtop reads ({FORMAT})")
    try:
        b = _Buf(zlib.decompress(blob[1:]))
    except zlib.error as exc:
        raise CodecError(f"chunk is damaged: {exc}") from None
    n, ncols = b.varint(), b.varint()
    names = [b.take(b.varint()).decode() for _ in range(ncols)]
    cols: list[list[Any]] = []
    for _ in range(ncols):
        tag = b.take(1)[0]
        kind = tag & ~_NULLS
        present = list(range(n))
        if tag & _NULLS:
            bitmap = b.take((n + 7) // 8)
            present = [j for j in range(n) if not bitmap[j >> 3] >> (j & 7) & 1]
        k = len(present)
        if kind == _ALL_NULL:
            vals: list[Any] = []
            present = []
        elif kind == _INT:
            vals = _read_ints(b, k)
        elif kind == _SCALED:
            p = 10 ** b.take(1)[0]
            vals = [m / p for m in _read_ints(b, k)]
        elif kind == _XOR:
            planes = [b.take(k) for _ in range(8)]
            packed = bytes(planes[byte][j] for j in range(k) for byte in range(8))
            prev, bits = 0, []
            for x in struct.unpack(f">{k}q", packed):
                prev ^= x
                bits.append(prev)
            vals = list(struct.unpack(f"<{k}d", struct.pack(f"<{k}q", *bits)))
        elif kind == _JSON:
            vals = json.loads(b.take(b.varint()))
        else:
            raise CodecError(f"unknown column kind {kind}")
        col: list[Any] = [None] * n
        for j, v in zip(present, vals, strict=True):
            col[j] = v
        cols.append(col)
    return names, list(zip(*cols, strict=True)) if cols else [() for _ in range(n)]
