"""The comparison table shows only meaningful numbers: no negative zero, 'bursty' instead of
raw ITL errors when tokens arrive coalesced, and every subcommand's --help shows defaults."""

from __future__ import annotations

import math

import pytest

from rackSim.metrics.records import RequestRecord
from rackSim.validate.command import main
from rackSim.validate.compare import (
    BURSTY_SHARE,
    coalesced_share,
    compare_summaries,
    format_table,
    write_comparison,
)

BASE = {"ttft_p50_ms": 100.0, "ttft_p90_ms": 200.0, "itl_p50_ms": 10.0, "itl_p90_ms": 20.0,
        "throughput_tok_s_gpu": 1000.0, "output_tok_s_gpu": 50.0, "itl_raw_p50_ms": 9.0,
        "itl_raw_p90_ms": 30.0, "cache_hit_rate": 0.7, "client_lag_mean_ms": 5.0,
        "coalesced_share": 0.0}


def _rec(times: list[float]) -> RequestRecord:
    r = RequestRecord(session_id=0, rid=0, lane=0, session_key=0, agent="main", send_s=0.0,
                      prompt_tokens=10)
    r.first_token_s, r.token_times_s = times[0], times
    return r


def test_coalesced_share_counts_gaps_under_half_a_millisecond():
    # gaps 10 ms, 0.1 ms, 10 ms, 0.2 ms: two of four coalesced
    r = _rec([1.0, 1.010, 1.0101, 1.0201, 1.0203])
    assert coalesced_share([r], 0.0, 2.0) == pytest.approx(0.5)
    assert math.isnan(coalesced_share([r], 5.0, 6.0))  # nothing in the window


def test_negative_zero_is_printed_as_zero():
    pred = dict(BASE, client_lag_mean_ms=-0.0000001)
    text = format_table(compare_summaries(BASE, pred))
    assert "-0.00" not in text
    row = [line for line in text.splitlines() if line.startswith("client lag")][0]
    assert row.split()[-1] == "n/a" and "0.00" in row


def test_a_value_not_measured_reads_n_a_not_nan():
    """Records without the server's own metrics (a run of the driver alone) have no server
    TTFT: the row printed 'nan' under 'measured'."""
    text = format_table(compare_summaries(dict(BASE, server_ttft_mean_ms=math.nan),
                                          dict(BASE, server_ttft_mean_ms=26.7)))
    row = [line for line in text.splitlines() if line.startswith("TTFT mean at server")][0]
    assert "nan" not in text and row.split()[-3:] == ["n/a", "26.70", "n/a"]


def test_the_error_labels_stay_inside_the_figure(caught_figures, tmp_path):
    """The error printed over the tallest predicted bar ran into the frame: the axes leave
    room above it."""
    import matplotlib.pyplot as plt

    figures = caught_figures(plt, "close", layout=False)  # after its savefig
    write_comparison(compare_summaries(BASE, dict(BASE, throughput_tok_s_gpu=1010.0)), tmp_path)
    for ax in figures[0].axes:
        frame = ax.get_window_extent()
        for label in ax.texts:  # a clear gap under the frame (the old one was < 1 pt)
            assert frame.y1 - label.get_window_extent().y1 > 4, label.get_text()


def test_raw_itl_of_bursty_runs_says_bursty_not_a_number():
    measured = dict(BASE, coalesced_share=BURSTY_SHARE + 0.1, itl_raw_p50_ms=0.01)
    df = compare_summaries(measured, BASE)
    raw = df[df.key.str.startswith("itl_raw")]
    assert raw.error_pct.isna().all() and raw.note.str.startswith("bursty").all()
    text = format_table(df)
    assert text.count("bursty") == 2 and "%" not in "".join(
        line for line in text.splitlines() if line.startswith("ITL raw"))
    # below the threshold the raw rows are compared as numbers
    calm = compare_summaries(dict(BASE, coalesced_share=BURSTY_SHARE / 2), BASE)
    assert calm.set_index("key").loc["itl_raw_p50_ms", "error_pct"] == pytest.approx(0.0)


def test_an_empty_queue_gets_no_relative_error():
    """The server's queue at one lane is 0.03 ms against the model's 0: -100 % would say
    nothing; under 1 ms measured the row says why instead, above it the error is computed."""
    idle = compare_summaries(dict(BASE, server_queue_mean_ms=0.03),
                             dict(BASE, server_queue_mean_ms=0.0)).set_index("key")
    assert math.isnan(idle.loc["server_queue_mean_ms", "error_pct"])
    assert idle.loc["server_queue_mean_ms", "note"].startswith("under 1 ms measured")
    busy = compare_summaries(dict(BASE, server_queue_mean_ms=23.0),
                             dict(BASE, server_queue_mean_ms=8.6)).set_index("key")
    assert busy.loc["server_queue_mean_ms", "error_pct"] == pytest.approx(-62.6, abs=0.1)
    assert "queue mean at server" in format_table(idle.reset_index())


@pytest.mark.parametrize("cmd,flag,default", [
    ("serve", "--max-num-seqs", "64"), ("run", "--max-errors", "10"),
    ("fit", "--source", "records"), ("compare", "--profile", None),
    ("ingest", "--out", None)])
def test_every_subcommand_help_shows_its_defaults(cmd, flag, default, capsys):
    with pytest.raises(SystemExit) as exc:
        main([cmd, "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert flag in out and "(default: None)" not in out
    if default is not None:
        assert f"(default: {default})" in out
