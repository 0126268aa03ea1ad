"""What a worker starts and stops: the topics it needs, its partitions, its
background tasks, the app's timers and hooks.
"""
