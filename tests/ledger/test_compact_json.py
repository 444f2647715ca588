"""compact_json writes JSON as vLLM's server does: its pydantic-core serializer's float text
(``0.00001``, ``1e+16``), raw UTF-8, compact separators."""

from __future__ import annotations

import random
import struct

from pydantic import TypeAdapter

from ledger.compact_json import compact_json


def test_floats_are_written_as_pydantic_core_writes_them():
    rng = random.Random(3)
    values = [1e-05, -1.19e-05, 1e16, 1.5e300, 0.1, -0.0, 5e-324, -9999.0, 123456789.0]
    while len(values) < 20_000:
        (x,) = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))
        if x == x and abs(x) != float("inf"):
            values.append(x)
        (f,) = struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))
        if f == f and abs(f) != float("inf"):
            values.append(f)  # a float32 logprob, as vLLM holds them
    assert compact_json(values) == TypeAdapter(list[float]).dump_json(values)


def test_text_and_structure_as_vllm_writes_them():
    value = {"text": 'é \u2028 \x1f "q" \\', "ids": [1, 2], "none": None, "ok": True}
    assert compact_json(value) == TypeAdapter(dict).dump_json(value)
    assert compact_json({"big": 2**70}) == b'{"big":1180591620717411303424}'  # every digit
