"""The NVIDIA stack played: the DRA driver (ComputeDomains, IMEX, claims) and the GPU stacks."""
