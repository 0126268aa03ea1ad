"""A worker's HTTP endpoint: the server, its gate and limits, access, table reads,
the live page and the status document it reads.
"""
