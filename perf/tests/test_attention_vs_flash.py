"""The sweep goal's count: a point is won only where ours is at most the peer, per pass."""

from __future__ import annotations

import statistics

import pytest

from perf.scripts.attention_vs_flash import compare, largest_ratios


def _row(impl, n, pass_, ms, causal=True, d=64):
    return dict(impl=impl, causal=causal, d=d, seq=n, ms=ms, status="ok", **{"pass": pass_})


def test_a_point_counts_where_ours_is_at_most_the_peer_and_missing_rows_are_not_counted():
    rows = [_row("triton", 1024, "forward", 1.0), _row("sdpa_flash", 1024, "forward", 1.0),  # a tie wins
            _row("triton", 8192, "forward", 2.0), _row("sdpa_flash", 8192, "forward", 1.5),
            _row("triton", 8192, "backward", 1.0), _row("sdpa_flash", 8192, "backward", 3.0),
            _row("triton", 8192, "forward_backward", 1.0),  # no peer row: not compared
            dict(_row("sdpa_flash", 1024, "backward", 1.0), status="error")]
    lines, counts = compare(rows, "triton", "sdpa_flash")
    assert counts["forward"] == [1, 2, 0, 1]
    assert counts["backward"] == [1, 1, 1, 1]
    assert counts["forward_backward"] == [0, 0, 0, 0]
    assert any("| causal | 64 | 8192 | 2.000 / 1.500 | 1.000 / 3.000 ** | - |" == ln for ln in lines)


def test_the_largest_ratio_is_found_per_pass_over_the_points_both_have():
    rows = [_row("gluon", 128, "forward", 1.2), _row("sdpa_flash", 128, "forward", 1.0),
            _row("gluon", 256, "forward", 0.9), _row("sdpa_flash", 256, "forward", 1.0),
            _row("gluon", 512, "forward", 9.0),  # no peer row: not a ratio
            _row("gluon", 128, "backward", 1.0, causal=False, d=128), _row("sdpa_flash", 128, "backward", 2.0,
                                                                             causal=False, d=128)]
    largest = largest_ratios(rows, "gluon", "sdpa_flash")
    assert set(largest) == {"forward", "backward"}
    assert largest["forward"][1] == ("causal", 64, 128) and abs(largest["forward"][0] - 1.2) < 1e-12
    assert largest["backward"] == (0.5, ("full", 128, 128))


def test_a_paired_point_is_read_by_the_median_of_its_rounds_ratios_not_the_ratio_of_medians():
    # round by round ours is below the peer, but a slow host in two of flash's rounds and in three of
    # ours puts our median above the peer's: paired, the point is won; unpaired, it is lost
    ours = dict(_row("gluon", 128, "backward", 0.0), ms_rounds=[0.9, 1.8, 1.8, 1.8, 0.9])
    peer = dict(_row("sdpa_flash", 128, "backward", 0.0), ms_rounds=[1.0, 2.0, 2.0, 1.0, 1.0])
    ours["ms"], peer["ms"] = 1.8, 1.0  # the rows' medians
    _, unpaired = compare([ours, peer], "gluon", "sdpa_flash")
    lines, paired = compare([ours, peer], "gluon", "sdpa_flash", paired=True)
    assert unpaired["backward"][:2] == [0, 1] and paired["backward"][:2] == [1, 1]
    assert "| causal | 64 | 128 | - | 0.900 ** | - |" in lines
    assert largest_ratios([ours, peer], "gluon", "sdpa_flash", paired=True)["backward"][0] == 0.9
    with pytest.raises(ValueError, match="paired ratio needs both rows' rounds"):
        compare([_row("gluon", 128, "forward", 1.0), _row("sdpa_flash", 128, "forward", 1.0)], "gluon", "sdpa_flash",
                paired=True)


def test_a_point_is_read_on_the_reading_asked_for_and_rows_without_it_are_not_compared():
    # do_bench's time loses (a slow host's issue read by the events), the device time with the GPU
    # held behind wins, and the host time per call wins; a peer row with no device time is not compared
    ours = dict(_row("gluon", 256, "forward", 0.015), device_ms=0.010, host_us=25.0,
                ms_rounds=[0.015, 0.016], device_ms_rounds=[0.010, 0.011], host_us_rounds=[25.0, 30.0])
    peer = dict(_row("sdpa_flash", 256, "forward", 0.011), device_ms=0.012, host_us=45.0,
                ms_rounds=[0.011, 0.011], device_ms_rounds=[0.012, 0.012], host_us_rounds=[45.0, 40.0])
    no_device = dict(_row("sdpa_flash", 512, "forward", 0.02), device_ms=None, host_us=40.0, host_us_rounds=[40.0, 40.0])
    mine = dict(_row("gluon", 512, "forward", 0.01), device_ms=0.01, host_us=20.0, host_us_rounds=[20.0, 20.0])
    rows = [ours, peer, no_device, mine]
    assert compare(rows, "gluon", "sdpa_flash")[1]["forward"][:2] == [1, 2]  # 256 lost, 512 won
    lines, by_device = compare(rows, "gluon", "sdpa_flash", reading="device")
    assert by_device["forward"][:2] == [1, 1] and "| causal | 64 | 256 | 0.010 / 0.012 ** | - | - |" in lines
    assert compare(rows, "gluon", "sdpa_flash", paired=True, reading="host")[1]["forward"][:2] == [2, 2]
    assert abs(largest_ratios(rows, "gluon", "sdpa_flash", paired=True, reading="device")["forward"][0]
               - statistics.median([0.010 / 0.012, 0.011 / 0.012])) < 1e-12
    assert "forward (gluon / sdpa_flash, us, host)" in compare(rows, "gluon", "sdpa_flash", reading="host")[0][0]
