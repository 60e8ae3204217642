"""Code that runs inside worker pods. Only ``train``/``verify`` import torch; ``nccl`` is stdlib."""
