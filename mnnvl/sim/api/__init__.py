"""The simulated API server: HTTP serving, the store, deletion and garbage collection, selectors,
authentication and RBAC; the controller base, Events and fault injection every part shares."""
