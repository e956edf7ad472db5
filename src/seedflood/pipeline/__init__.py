"""GWTF: churn-tolerant pipeline-parallel training routed as a min-cost flow, and SWARM."""
