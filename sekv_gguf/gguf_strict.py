"""gguf-py's mmap ``GGUFReader`` made strict about the end of the file. The stock reader slices its memory map and
takes what is there: a count or size that runs past the end yields a short (or empty) array, and a damaged array
count then loops up to 2^64 times without moving (a scalar array past the end reads 0 bytes per element); a count
that does fit builds a numpy view per element (~150 bytes of Python objects per byte of file). Here every read that
the file cannot hold raises ``ValueError`` naming the offset, an array whose count cannot fit in the rest of the
file is refused before its loop, and arrays of scalars are read in one piece, so parse time and memory stay bounded
by the file's size. Only ``contents()`` of whole fields is supported for those arrays (what this package reads)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

# the fewest bytes one array element of these types takes (a string: its u64 length; an array: type + count)
_LEAST_BYTES = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}


class StrictGGUFReader(GGUFReader):
    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        count = int(count)
        end = int(offset) + np.dtype(dtype).itemsize * count
        if offset < 0 or count < 0 or end > len(self.data):
            raise ValueError(f"GGUF data ends at byte {len(self.data)}: {count} x {np.dtype(dtype).name} wanted at "
                             f"byte {offset} (a count or size past the end of the file: truncated or corrupt)")
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[np.ndarray], list[int], list[Any]]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        offs, count = orig_offs + 12, int(alen[0])
        itype = GGUFValueType(int(raw_itype[0]))  # ValueError for an unknown type
        scalar = self.gguf_scalar_to_np.get(itype)
        least = _LEAST_BYTES[itype] if scalar is None else np.dtype(scalar).itemsize
        if count * least > len(self.data) - offs:
            raise ValueError(f"GGUF array at byte {orig_offs} claims {count} elements of {itype.name}: more than the "
                             f"{len(self.data) - offs} bytes left in the file")
        if scalar is None:  # strings and nested arrays: gguf-py's loop, now bounded by the file's size
            return super()._get_field_parts(orig_offs, raw_type)
        values = self._get(offs, scalar, count)
        types = [GGUFValueType.ARRAY] + ([itype] if count else [])
        return 12 + int(values.nbytes), [raw_itype, alen, values], [2], types
