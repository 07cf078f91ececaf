"""pmemwal's tools, built on the library: the ``pmemwal`` command (cli), the write benchmark
(bench), the comparison harness (harness) and its targets, one module per peer (targets),
crash torture (torture), simulated power loss (powerloss) and the read-only inspection of a
WAL (inspect).  The library never imports from here.
"""
