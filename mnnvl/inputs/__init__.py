"""The input layer: every value a user gives, validated and named before anything is created
(``docs/DESIGN.md`` lists its modules). Standard library only; nothing here talks to a cluster.
"""
