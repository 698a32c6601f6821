"""The offline lane: OpenAI's Batch API (/v1/files, /v1/batches) stored on disk, run on idle
capacity. No HTTP here and nothing from serving/llm/: the routes are serving/routes/batch_api.py,
and the lane reaches the ingress only through LaneHost (lane.py).

    store.py      the on-disk layout: files, batch records, per-line result journals
    jobs.py       pure: parse an input file, build Batch / output records, the state machine
    job.py        one batch's state in memory (lines pending, in flight, done)
    scheduler.py  pure: how many batch requests may run now; whether to start the cold pool
    outlook.py    the lane's forecast: the cold-pool ask and completion estimates
    runner.py     BatchRunner: the loop that runs batch lines, and the API's batch operations
    lane.py       OfflineLane: the ingress's part that holds the runner; LaneHost, what it asks
    cli.py        `tideserve batches`, a client of GET /v1/batches

Its config is the `batch_api:` section (serving/config/batch_api.py); the on-disk format is
documented in docs/batch.md.
"""
