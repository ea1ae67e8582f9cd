"""``LevelClock.price``: the level host time a round is charged, never a price that stops its own re-measurement."""

from __future__ import annotations

from sage_plugin.engines.rounds import LevelClock


def test_docstring_example():
    clock = LevelClock(min_samples=2, probe_every=2)
    clock.samples.append(15.0)
    assert clock.price() == 0.0, "one sample (a first level's one-off costs) is not a price"
    clock.samples.extend([1.0, 1.0])
    assert [clock.price() for _ in range(4)] == [1.0, 1.0, 0.0, 1.0]


def test_a_sample_resets_staleness():
    clock = LevelClock(min_samples=1, probe_every=3)
    clock.samples.append(2.0)
    assert [clock.price() for _ in range(2)] == [2.0, 2.0]  # two of the three priced rounds before a probe
    clock.start()
    clock.end()  # a drafted level: a fresh sample, so three priced rounds again before the probe
    m = clock.ms()
    assert 0.0 < m <= 2.0
    assert [clock.price() for _ in range(5)] == [m, m, m, 0.0, m]


def test_unkept_clock_never_prices():
    clock = LevelClock(0)  # window 0: price_level_host off
    clock.start()
    clock.end()
    assert not clock.samples and [clock.price() for _ in range(40)] == [0.0] * 40


def test_probe_rate_is_one_in_probe_every_plus_one():
    clock = LevelClock(min_samples=1, probe_every=16)
    clock.samples.append(50.0)
    prices = [clock.price() for _ in range(170)]
    assert prices.count(0.0) == 10 and all(p == 50.0 for p in prices if p)
