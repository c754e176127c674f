#!/usr/bin/env python3
"""The charts of BENCHMARKS.md: one SVG bar chart per data file of bench/results/.

    python3 bench/charts.py             # writes docs/charts/NAME.svg for every bench/results/NAME.json
    python3 bench/charts.py --check     # fails if a checked-in chart differs from its data (or is not linked)
    python3 bench/charts.py --markup NAME   # prints the <img> to paste under the table in BENCHMARKS.md

Standard library only, and the output depends on nothing but the data files, so that a chart
can be checked byte for byte (in CI, say).

How a run's figures get here: by hand, for now. The bench scripts print tables (Markdown or
plain text) and JSON lines, not these files; after a run, copy its figures into the table of
BENCHMARKS.md and into the matching file of bench/results/ (the same strings, thousands
separators included), set its date, commit and command, then run this script and check in both
the data file and the SVG. Nothing reads a script's output directly. `--check` catches a chart
that was not redrawn, and a charted figure that no longer appears in BENCHMARKS.md (a table
updated without its data file), but not a figure mistyped into both. See bench/results/README.md.

A data file (JSON):

    {
      "title": "...",                       the chart's title
      "measurement": "...",                 what was measured, and where the table is
      "date": "2026-12-04", "commit": "4368f12",
      "command": "bench/compare.sh",        the command that reproduces the table
      "unit": "records/s",                  the unit of every value
      "axis": "...",                        the axis label (with the unit)
      "alt": "...",                         the image's alternative text in BENCHMARKS.md
      "runs": ["run 10", "run 11"],         optional: the table's cells hold one figure per run
      "series": ["ours", "Redis 7"],        one bar (or one per run) per series in each row
      "rows": [{"label": "...", "values": [["414,152", "330,986"], ["411,692", "381,533"]]}],
      "note": "..."                         optional: printed under the chart
    }

A row's values are in the order of "series"; each is null (no bar), or a list of the figures as
the table prints them: one per run, or a single one where the table gives one figure for both.
Without "runs", each list holds one figure.

BENCHMARKS.md is included into the documentation book from docs/benchmarks.md, so one image
link has to work from the repository's root (GitHub) and from docs/ (mdBook, whose output has
docs/charts/ as charts/). A Markdown image cannot, so each chart is an <img> whose source is
the path from the root and which, when that fails to load (in the book), takes the path from
docs/ instead; GitHub drops the onerror attribute and keeps the source, which works there.
"""

import html
import json
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "charts"
PAGE = ROOT / "BENCHMARKS.md"

WIDTH = 860
MARGIN = 16
LABEL_WIDTH = 276
PLOT_LEFT = MARGIN + LABEL_WIDTH + 12
PLOT_RIGHT = WIDTH - 96
BAR = 13
BAR_GAP = 2
ROW_PAD = 9
FONT = "Helvetica, Arial, sans-serif"
COLOURS = ["#3b6ea8", "#c8553d", "#4f9a6b", "#8e6bb0", "#b08a2e"]
# A second run's bar: the series' colour, lighter.
RUN_OPACITY = ["1", "0.5", "0.3"]


def number(text):
    """A table's figure ("1,067,860", "0.40") as a float."""
    return float(text.replace(",", "").replace(" ", ""))


def wrap(text, size, width):
    """`text` in lines of at most `width` pixels at font `size` (an estimate: no font metrics)."""
    limit = max(8, int(width / (size * 0.56)))
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > limit:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return lines or [""]


def nice_ticks(top):
    """Ticks from 0 past `top`: steps of 1, 2, 2.5 or 5 times a power of ten, about 5 of them."""
    if top <= 0:
        return [0, 1]
    raw = top / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    count = math.ceil(round(top / step, 9))
    return [round(i * step, 9) for i in range(count + 1)]


def tick_label(value, top):
    if value == 0:
        return "0"
    if top >= 1e6:
        return f"{value / 1e6:g} M"
    if top >= 1e4:
        return f"{value / 1e3:g} k"
    return f"{value:g}"


def px(value):
    return f"{value:.1f}"


def text(x, y, content, size=12, fill="#222", anchor="start", weight=None):
    bold = f' font-weight="{weight}"' if weight else ""
    return (
        f'<text x="{px(x)}" y="{px(y)}" font-size="{size}" fill="{fill}" '
        f'text-anchor="{anchor}"{bold}>{html.escape(content, quote=False)}</text>'
    )


def validate(name, data):
    for key in ("title", "measurement", "date", "commit", "command", "unit", "axis", "alt"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ValueError(f"{name}: '{key}' missing")
    series = data.get("series")
    if not series or not isinstance(series, list):
        raise ValueError(f"{name}: 'series' missing")
    runs = data.get("runs") or [None]
    for row in data.get("rows") or []:
        values = row.get("values")
        if not isinstance(values, list) or len(values) != len(series):
            raise ValueError(f"{name}: row '{row.get('label')}' has not one entry per series")
        for cell in values:
            if cell is None:
                continue
            if not isinstance(cell, list) or len(cell) not in (1, len(runs)):
                raise ValueError(f"{name}: row '{row.get('label')}': {cell!r} is not one figure per run")
            for figure in cell:
                number(figure)
    if not data.get("rows"):
        raise ValueError(f"{name}: no rows")


def render(data):
    """The SVG of one data file, as text."""
    runs = data.get("runs") or []
    series = data["series"]
    out = []
    y = MARGIN + 18
    body = [text(MARGIN, y, data["title"], size=17, weight="bold")]
    y += 6
    subtitle = f"Measured {data['date']} at commit {data['commit']}: {data['command']}"
    for line in wrap(subtitle, 12, WIDTH - 2 * MARGIN):
        y += 17
        body.append(text(MARGIN, y, line, fill="#555"))

    # The legend: a swatch per series, then which shade is which run.
    y += 24
    x = MARGIN
    items = [(name, COLOURS[i % len(COLOURS)]) for i, name in enumerate(series)]
    for name, colour in items:
        width = 18 + len(name) * 12 * 0.56 + 18
        if x + width > WIDTH - MARGIN:
            x, y = MARGIN, y + 18
        body.append(f'<rect x="{px(x)}" y="{px(y - 10)}" width="12" height="12" fill="{colour}"/>')
        body.append(text(x + 18, y, name))
        x += width
    if len(runs) > 1:
        shades = ", ".join(
            f"{'darker' if i == 0 else 'lighter'} bar: {run}" for i, run in enumerate(runs)
        )
        note = f"In each series, {shades}."
        if x + len(note) * 12 * 0.56 > WIDTH - MARGIN:
            x, y = MARGIN, y + 18
        body.append(text(x, y, note, fill="#555"))

    top = max(number(f) for row in data["rows"] for cell in row["values"] if cell for f in cell)
    ticks = nice_ticks(top)
    tick_top = ticks[-1]
    scale = (PLOT_RIGHT - PLOT_LEFT) / ticks[-1]
    width_left = WIDTH - MARGIN - PLOT_LEFT

    plot_top = y + 16
    y = plot_top
    rows = []
    for row in data["rows"]:
        bars = []
        for s, cell in enumerate(row["values"]):
            if not cell:
                continue
            for r, figure in enumerate(cell):
                label = figure
                if len(cell) == 1 and len(runs) > 1:
                    label = f"{figure} (both runs)"
                bars.append((s, r, label, number(figure)))
        lines = wrap(row["label"], 12, LABEL_WIDTH)
        inner = max(len(bars) * BAR + (len(bars) - 1) * BAR_GAP, len(lines) * 15)
        height = inner + 2 * ROW_PAD
        rows.append((y, height, inner, bars, lines))
        y += height
    plot_bottom = y
    # Every bar's figure printed after it must fit: narrow the scale for the longest ones.
    for _, _, _, bars, _ in rows:
        for _, _, label, value in bars:
            room = width_left - 4 - len(label) * 11 * 0.56
            scale = min(scale, room / value)
    ticks = [tick for tick in ticks if tick * scale <= width_left]

    # Grid first, bars over it.
    for tick in ticks:
        gx = PLOT_LEFT + tick * scale
        colour = "#999" if tick == 0 else "#e3e3e3"
        body.append(
            f'<line x1="{px(gx)}" y1="{px(plot_top)}" x2="{px(gx)}" y2="{px(plot_bottom)}" '
            f'stroke="{colour}" stroke-width="1"/>'
        )
        body.append(text(gx, plot_bottom + 15, tick_label(tick, tick_top), size=11, fill="#555", anchor="middle"))
    for index, (ry, height, inner, bars, lines) in enumerate(rows):
        if index:
            body.append(
                f'<line x1="{px(MARGIN)}" y1="{px(ry)}" x2="{px(WIDTH - MARGIN)}" y2="{px(ry)}" '
                f'stroke="#eeeeee" stroke-width="1"/>'
            )
        label_top = ry + ROW_PAD + (inner - len(lines) * 15) / 2
        for i, line in enumerate(lines):
            body.append(text(MARGIN, label_top + 11 + i * 15, line))
        bars_top = ry + ROW_PAD + (inner - (len(bars) * BAR + (len(bars) - 1) * BAR_GAP)) / 2
        for i, (s, r, label, value) in enumerate(bars):
            by = bars_top + i * (BAR + BAR_GAP)
            width = max(1.0, value * scale)
            colour = COLOURS[s % len(COLOURS)]
            opacity = RUN_OPACITY[min(r, len(RUN_OPACITY) - 1)]
            body.append(
                f'<rect x="{px(PLOT_LEFT)}" y="{px(by)}" width="{px(width)}" height="{BAR}" '
                f'fill="{colour}" fill-opacity="{opacity}"/>'
            )
            body.append(text(PLOT_LEFT + width + 4, by + BAR - 2.5, label, size=11, fill="#333"))

    y = plot_bottom + 36
    body.append(text((PLOT_LEFT + PLOT_RIGHT) / 2, y, data["axis"], anchor="middle", fill="#333"))
    if data.get("note"):
        y += 8
        for line in wrap(data["note"], 11, WIDTH - 2 * MARGIN):
            y += 15
            body.append(text(MARGIN, y, line, size=11, fill="#555"))
    height = round(y + MARGIN)

    out.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" font-family="{FONT}">'
    )
    out.append(f"<title>{html.escape(data['title'], quote=False)}</title>")
    out.append(f"<desc>{html.escape(data['alt'], quote=False)}</desc>")
    out.append(f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>')
    out.extend(body)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def markup(name, data):
    """The <img> that shows chart `name` on GitHub (path from the root) and in the book (from docs/)."""
    alt = html.escape(data["alt"], quote=False).replace('"', "&quot;")
    return (
        f'<img src="docs/charts/{name}.svg" alt="{alt}" '
        f"onerror=\"this.onerror=null;this.src='charts/{name}.svg'\">"
    )


def load():
    charts = {}
    for path in sorted(DATA.glob("*.json")):
        data = json.loads(path.read_text())
        validate(path.name, data)
        charts[path.stem] = data
    return charts


def main(argv):
    charts = load()
    if argv[:1] == ["--markup"]:
        for name in argv[1:]:
            print(markup(name, charts[name]))
        return 0
    if argv and argv != ["--check"]:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv == ["--check"]:
        errors = []
        page = PAGE.read_text()
        for name, data in charts.items():
            path = OUT / f"{name}.svg"
            if not path.exists():
                errors.append(f"{path.relative_to(ROOT)} is missing")
            elif path.read_text() != render(data):
                errors.append(f"{path.relative_to(ROOT)} differs from bench/results/{name}.json")
            if f'src="docs/charts/{name}.svg"' not in page or f"'charts/{name}.svg'" not in page:
                errors.append(f"BENCHMARKS.md does not show {name}.svg (python3 bench/charts.py --markup {name})")
            # A weak guard against a table updated without its data file: every figure charted
            # must still be printed somewhere on the page.
            for row in data["rows"]:
                for figure in (f for cell in row["values"] if cell for f in cell):
                    if figure not in page:
                        errors.append(f"bench/results/{name}.json: {figure} ({row['label']}) is not in BENCHMARKS.md")
        for path in sorted(OUT.glob("*.svg")):
            if path.stem not in charts:
                errors.append(f"{path.relative_to(ROOT)} has no data file in bench/results/")
        for error in errors:
            print(error, file=sys.stderr)
        if errors:
            print("run python3 bench/charts.py to redraw the charts", file=sys.stderr)
            return 1
        print(f"{len(charts)} charts match their data")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, data in charts.items():
        (OUT / f"{name}.svg").write_text(render(data))
    print(f"wrote {len(charts)} charts to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
