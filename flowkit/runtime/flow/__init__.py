"""The record path: fetched batches to the agents that own them, failures, checkpoints.

``fetcher`` hands batches to agent instances along ``routes``; ``dispatch`` runs the
agents and executes what a failed record's decision says; ``checkpoints`` commits
only what every output it caused has been acknowledged for.
"""
