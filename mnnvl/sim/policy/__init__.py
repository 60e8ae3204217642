"""Cluster policy: pod admission, PodSecurity, the Kueue stand-in, node lifecycle."""
