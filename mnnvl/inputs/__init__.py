"""The input layer: every value a user gives, validated and named before anything is created.

The spec dataclasses and their field declarations (``spec``), the pure checks they apply
(``checks``) and the values they start from (``defaults``), every step's and pipeline's inputs
(``surface``) and their command-line flags (``flags``), the names made from a run id
(``names``), shared-storage mounts (``storage``), the namespace resolved at the edges
(``namespace``) and the bus-bandwidth baselines verification judges against (``baselines``).
Standard library only; nothing here talks to a cluster.
"""
