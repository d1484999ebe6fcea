"""The inline SVG plots: well-formed, escaped, sensible axes."""

import xml.etree.ElementTree as ET

import pytest

from evals import svg

NS = "{http://www.w3.org/2000/svg}"


def parse(text: str) -> ET.Element:
    root = ET.fromstring(text)
    assert root.tag == f"{NS}svg"
    return root


def bars(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(f"{NS}rect") if r.get("fill") == svg.COLOR]


def test_histogram_counts_every_value():
    root = parse(svg.histogram([0.1, 0.2, 0.2, 0.9, 1.5], "Latency", "seconds", bins=5))
    counts = [int(r.find(f"{NS}title").text.split(": ")[1]) for r in bars(root)]
    assert sum(counts) == 5
    assert root.find(f"{NS}title").text == "Latency"


def test_histogram_of_whole_numbers_has_one_bin_per_value_and_integer_ticks():
    root = parse(svg.histogram([3, 3, 4, 6], "Tokens", "tokens"))
    titles = [r.find(f"{NS}title").text for r in bars(root)]
    assert titles == ["2.5..3.5: 2", "3.5..4.5: 1", "5.5..6.5: 1"]
    labels = [t.text for t in root.iter(f"{NS}text")]
    assert "0.5" not in labels and "1" in labels and "2" in labels


def test_bar_chart_escapes_labels_and_shows_zero_percent_tracks():
    root = parse(svg.bar_chart(["<script>", "b&c"], [0.0, 50.0], "Pass rate",
                               max_value=100, value_format="{:.0f}%"))
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert "<script>" in texts and "b&c" in texts and "0%" in texts and "50%" in texts
    tracks = [r for r in root.iter(f"{NS}rect") if r.get("fill") == "#eee"]
    assert len(tracks) == 2


def test_line_chart_and_empty_plots():
    root = parse(svg.line_chart([0, 1, 2], [0, 5, 9], "Throughput", "s", "responses",
                                integer=True))
    points = root.find(f"{NS}polyline").get("points").split()
    assert len(points) == 3
    for plot in (svg.histogram([], "t", "x"), svg.bar_chart([], [], "t"),
                 svg.line_chart([], [], "t", "x", "y")):
        assert "no data" in plot
        parse(plot)


@pytest.mark.parametrize("low, high, integer, expected", [
    (0, 7, True, [0, 2, 4, 6, 8]),
    (0, 3, True, [0, 1, 2, 3]),
    (0, 1, False, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
    (0.2984, 0.3024, False, [0.298, 0.299, 0.3, 0.301, 0.302, 0.303]),
])
def test_nice_ticks(low, high, integer, expected):
    assert svg.nice_ticks(low, high, integer=integer) == pytest.approx(expected)


def test_timeline_rows_share_one_axis_and_escape_labels():
    root = parse(svg.timeline(
        [("<slow>", "2.000s", 2.0, [(0.0, 0.5, "turn", "turn 0"), (0.5, 1.5, "tool", "python"),
                                    (1.5, 1.6, "wait", "turn 1"), (1.6, 1.9, "turn", "turn 1")]),
         ("fast", "0.100s", 0.1, [])],
        "Slowest", "seconds", {"turn": "model", "tool": "tool call"}))
    rows = [g for g in root.iter(f"{NS}g") if g.get("class") == "timeline-row"]
    assert [r.find(f"{NS}text").text for r in rows] == ["<slow>", "fast"]
    bars = [(r.get("fill"), r.find(f"{NS}title").text, float(r.get("x")), float(r.get("width")))
            for r in rows[0].iter(f"{NS}rect") if r.find(f"{NS}title") is not None]
    assert [(fill, title) for fill, title, _, _ in bars] == [
        (svg.TIMELINE_COLORS[kind], title) for kind, title in
        [("turn", "turn 0"), ("tool", "python"), ("wait", "turn 1"), ("turn", "turn 1")]]
    assert all(a[2] + a[3] == pytest.approx(b[2], abs=0.11) for a, b in zip(bars, bars[1:]))  # end to end
    assert bars[1][3] == pytest.approx(2 * bars[0][3], abs=0.11)  # 1 s is twice 0.5 s
    assert "0.100s" in [t.text for t in rows[1].iter(f"{NS}text")]
    assert "2" in [t.text for t in root.iter(f"{NS}text")]  # the axis reaches the longest row
    assert svg.timeline([], "Slowest", "seconds", {}).count("no data") == 1
