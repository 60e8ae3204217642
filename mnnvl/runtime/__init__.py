"""Code that runs inside worker pods. Only ``train``/``verify`` import torch; what the launcher
side shares with the workers (RESULT line, NCCL profiles, exit codes) is ``mnnvl.contract``."""
