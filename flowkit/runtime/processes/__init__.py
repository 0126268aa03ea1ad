"""Several worker processes of one app under one parent (``--processes N``)."""
