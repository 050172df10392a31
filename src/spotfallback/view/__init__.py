"""Views of a run: its snapshot, text and live progress, the cost report and the timeline.

``snapshot`` (where a run stands), ``text`` (words and panels), ``watcher`` (live progress
while it trains), ``report`` (what it cost), ``intervals`` and ``timeline`` (its time, drawn).
"""
