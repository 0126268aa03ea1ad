"""The worker's side of tables: their stores, recovery, changelog flushes, standbys."""
