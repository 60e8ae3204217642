"""Modules ``make compile`` writes (``python -m mnnvl.pipelines.compile``); never edit by hand."""
