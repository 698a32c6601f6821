"""The offline lane: OpenAI's /v1/files and /v1/batches, stored on disk, run on idle capacity.

    config.py     the `batch:` section of cluster.yaml (BatchSection)
    store.py      the on-disk layout: files, batch records, per-line result journals
    jobs.py       pure: parse an input file, build Batch / output records, the state machine
    scheduler.py  pure: how many batch requests may run now; whether to start the cold pool
    runner.py     the ingress's background task that runs batch lines in the offline tier
    routes.py     the HTTP routes (a mixin of the ingress class)

The on-disk format is documented in docs/batch.md.
"""
