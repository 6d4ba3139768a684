"""The power probe's reading of nvidia-smi's samples: only the steady window counts."""

from __future__ import annotations

import math

from perf.scripts.attention_power import window_means


def _sample(t, watts, mhz, celsius="60", reasons="0x0000000000000004"):
    return (t, [watts, mhz, celsius, reasons])


def test_only_samples_inside_the_window_are_averaged():
    samples = [_sample(0.5, "100", "1980"), _sample(1.0, "690", "1600"), _sample(1.5, "700", "1620"),
               _sample(2.0, "680", "1640", reasons="0x0000000000000000"), _sample(2.5, "90", "1980")]
    w = window_means(samples, 1.0, 2.0)
    assert w["n"] == 3
    assert math.isclose(w["watts"], 690.0) and math.isclose(w["mhz"], 1620.0)
    assert w["reasons"] == "0x0000000000000000 0x0000000000000004"


def test_an_unreadable_field_is_left_out_of_its_mean_and_an_empty_window_reads_nan():
    samples = [_sample(1.0, "[N/A]", "1600"), _sample(1.1, "650", "[N/A]")]
    w = window_means(samples, 0.0, 2.0)
    assert math.isclose(w["watts"], 650.0) and math.isclose(w["mhz"], 1600.0)
    empty = window_means(samples, 5.0, 6.0)
    assert empty["n"] == 0 and math.isnan(empty["watts"]) and empty["reasons"] == ""
