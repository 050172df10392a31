"""Views of a run: its snapshot, text and live progress, the cost report and the timeline."""
