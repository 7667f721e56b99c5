"""The HTML run report: one self-contained file (inline CSS, hand-written SVG, a little JavaScript).

gather.py reads a run (its provenance, the store's trace rows, the failed
subjects' log tails), charts.py draws histograms and the timeline as SVG,
page.py lays the page out. See docs/report.md for why the charts are
hand-written SVG rather than an embedded charting library.
"""
