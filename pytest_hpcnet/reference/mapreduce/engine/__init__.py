"""The distributed MapReduce engine: a driver (``driver.Engine``) and one worker process per node,
a shuffle server in every worker (``shuffle``), jobs (``jobs``: teragen, terasort, teravalidate,
randomwriter, sort) and named configurations (``config``: transport, intermediate, shuffle, net).

    with Engine(cluster, launchers) as engine:
        jobs.teragen(engine, 100_000, out / "in", maps=4)
        result = jobs.terasort(engine, out / "in", out / "sorted", reduces=4,
                               config="transport=shm,intermediate=shared,shuffle=direct")
"""
