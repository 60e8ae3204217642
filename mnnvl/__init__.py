"""mnnvl-pipelines: ComputeDomains, MNNVL-tuned training, NVLink verification, teardown."""

__version__ = "0.1.0"
