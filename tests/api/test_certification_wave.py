"""A certification wave whose probe fails cancels the wave's other probes at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from api.certifier import _wave
from ledger.errors import Unreachable


def test_a_failed_probe_cancels_the_rest_of_its_wave() -> None:
    cancelled: list[int] = []

    async def slow(n: int) -> object:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(n)
            raise
        return n

    async def failing() -> object:
        await asyncio.sleep(0.05)
        raise Unreachable("worker w does not answer", code="worker_unreachable")

    async def main() -> list[int]:
        with pytest.raises(Unreachable):
            await _wave([slow(1), failing(), slow(2)])  # type: ignore[list-item]
        return sorted(cancelled)  # by the time the wave fails, not at the loop's end

    started = time.monotonic()
    assert asyncio.run(main()) == [1, 2]
    assert time.monotonic() - started < 5
